"""The envelope wire format, byte for byte with the Rust consumer."""

from __future__ import annotations

import pytest

from fdl_tasks.envelope import ENV_PREBUILD_PER_HOST, PerHostEnvelope, decode, encode
from fdl_tasks.errors import FdlError

# SPEC's example, as serde_json writes a BTreeMap<String, PerHostEnvelope>
# whose cwd_subpath is skipped when empty.
SPEC_EXAMPLE = (
    '{"host-a":{"bin":"target/cluster/host-a/precompiled-cu128/release/bench",'
    '"ld_library_path":"/mnt/proj/libtorch/precompiled/cu128/lib"},'
    '"host-b":{"bin":"target/cluster/host-b/builds-sm61-sm120/release/bench",'
    '"ld_library_path":"/srv/proj/libtorch/builds/sm61-sm120/lib","cwd_subpath":"ddp-bench"}}'
)


def test_matches_spec_example_byte_for_byte() -> None:
    envelopes = {
        "host-b": PerHostEnvelope(
            "target/cluster/host-b/builds-sm61-sm120/release/bench",
            "/srv/proj/libtorch/builds/sm61-sm120/lib",
            "ddp-bench",
        ),
        "host-a": PerHostEnvelope(
            "target/cluster/host-a/precompiled-cu128/release/bench",
            "/mnt/proj/libtorch/precompiled/cu128/lib",
        ),
    }
    assert encode(envelopes) == SPEC_EXAMPLE
    assert decode(SPEC_EXAMPLE, "x") == envelopes
    assert ENV_PREBUILD_PER_HOST == "FLODL_INTERNAL_PREBUILD_PER_HOST"


def test_unicode_is_written_as_utf8_like_serde() -> None:
    text = encode({"a": PerHostEnvelope("bin", "/mnt/données/lib")})
    assert "données" in text and "\\u" not in text


def test_keys_sorted_by_bytes() -> None:
    text = encode({k: PerHostEnvelope("b", "/l") for k in ["b", "B", "a-1", "a"]})
    assert list(decode(text, "x")) == ["B", "a", "a-1", "b"]


def test_absent_cwd_subpath_reads_as_empty() -> None:
    assert decode('{"h":{"bin":"b","ld_library_path":"/l"}}', "x")["h"].cwd_subpath == ""


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"h":{"bin":"b"', "not valid JSON"),
        ("[]", "JSON object keyed by host"),
        ('{"h":"b"}', "['h']: expected a mapping"),
        ('{"h":{"bin":"b"}}', "['h'].ld_library_path: required key missing"),
        ('{"h":{"ld_library_path":"/l"}}', "['h'].bin: required key missing"),
        ('{"h":{"bin":1,"ld_library_path":"/l"}}', "['h'].bin: expected a string"),
        ('{"h":{"bin":"b","ld_library_path":"/l","cwd_subpath":3}}', "cwd_subpath"),
    ],
)
def test_malformed_envelopes_are_rejected(text: str, fragment: str) -> None:
    with pytest.raises(FdlError, match=r"env\.json") as caught:
        decode(text, "env.json")
    assert fragment in str(caught.value)


def test_unknown_fields_are_ignored_like_serde() -> None:
    """flodl's consumer struct has no deny_unknown_fields: a newer writer's field is skipped."""
    read = decode('{"h":{"bin":"b","ld_library_path":"/l","later":1}}', "x")
    assert read == {"h": PerHostEnvelope("b", "/l")}
