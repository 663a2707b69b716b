"""The envelope wire format, byte for byte with the Rust consumer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fdl_tasks.config.launch_mode import ENV_PREBUILD_PER_HOST
from fdl_tasks.core.errors import FdlError
from fdl_tasks.publish.envelope import PerHostEnvelope, decode, encode, read_file

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


# Rust ``String``s are any Unicode scalar values: everything but surrogates, which
# hypothesis' text() never draws. The consumer must read whatever serde writes.
wire_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
entries = st.builds(PerHostEnvelope, wire_text, wire_text, wire_text)


@given(st.dictionaries(wire_text, entries, max_size=5))
def test_decode_reads_everything_encode_writes(envelopes: dict[str, PerHostEnvelope]) -> None:
    """Control characters, quotes, U+2028, emoji: validation belongs to the cluster
    file's edge, never to the wire format."""
    text = encode(envelopes)
    assert decode(text, "x") == envelopes
    assert encode(decode(text, "x")) == text  # a reader's rewrite is byte for byte


@given(st.dictionaries(wire_text, entries, max_size=5))
def test_encoding_is_what_serde_json_writes(envelopes: dict[str, PerHostEnvelope]) -> None:
    """serde_json's compact writer: keys of a BTreeMap sorted by their UTF-8 bytes, fields
    in declaration order, an empty cwd_subpath skipped, UTF-8 unescaped, control
    characters escaped as \\n, \\t, … or \\u00XX, nothing else escaped but '"' and '\\\\'."""
    text = encode(envelopes)
    hosts = sorted(envelopes, key=lambda host: host.encode())
    assert list(json.loads(text)) == hosts
    for host in hosts:
        entry = json.loads(text)[host]
        expected = ["bin", "ld_library_path"] + (
            ["cwd_subpath"] if envelopes[host].cwd_subpath else []
        )
        assert list(entry) == expected
    assert not any(ord(ch) < 0x20 for ch in text)  # every control character escaped
    escapes = re.findall(r"\\u([0-9a-f]{4})", text.replace("\\\\", ""))
    assert all(int(code, 16) < 0x20 for code in escapes)  # only C0 controls get \\u escapes


def test_control_characters_round_trip() -> None:
    envelopes = {"h\tx": PerHostEnvelope("a\tb", "/l\n", "\x01")}
    text = encode(envelopes)
    assert text == '{"h\\tx":{"bin":"a\\tb","ld_library_path":"/l\\n","cwd_subpath":"\\u0001"}}'
    assert decode(text, "x") == envelopes


def test_read_file_none_when_missing_an_error_naming_it_otherwise(tmp_path: Path) -> None:
    """The merge base of a publication: absent is no entries; unreadable or malformed is an
    error naming the file, never an empty envelope."""
    path = tmp_path / "ddp-bench.json"
    assert read_file(path) is None
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(FdlError, match=f"cannot read the envelope {re.escape(str(path))}: "):
        read_file(path)
    path.write_text('{"a": {"bin": 3}}')
    with pytest.raises(FdlError, match=f"{re.escape(str(path))}: a malformed prebuild envelope"):
        read_file(path)
    path.write_text(encode({"a": PerHostEnvelope("b", "c")}))
    assert read_file(path) == {"a": PerHostEnvelope("b", "c")}
