"""ssh options: an ssh_config block that says exactly what was written, nothing more.

The oracle is OpenSSH's reading of ``-o`` options (first value wins,
``IdentityFile`` accumulates, quotes are removed), compared with what paramiko
parses out of the block Fabric is given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import paramiko
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fdl_tasks.config.model import Worker
from fdl_tasks.ssh.sshconfig import HONOURED_OPTIONS, ssh_config_block
from tests.unit.hostile.conftest import hostile, load, one_worker

SSH_KEYS = sorted(
    {"HostName", "Port", "User", "IdentityFile", "ProxyJump", "ProxyCommand"}
    | {"ConnectTimeout", "ForwardAgent", "Host", "Match", "LocalCommand", "SendEnv"}
)
SSH_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+)(.*)")


def ssh_options() -> st.SearchStrategy[str]:
    def build(key: str, sep: str, value: str) -> str:
        return f"{key}{sep}{value.strip() or 'v'}"

    return st.builds(
        build,
        st.sampled_from(SSH_KEYS).map(lambda k: k if k != "Port" else "port"),
        st.sampled_from(["=", " ", " = ", " ="]),
        hostile,
    )


def parsed_ssh_config(worker: Worker) -> tuple[list[dict[str, Any]], list[str]]:
    block, ignored = ssh_config_block(worker)
    config = paramiko.SSHConfig.from_text(block)
    contexts: list[dict[str, Any]] = vars(config)["_config"]
    return contexts, ignored


def expected_ssh_config(options: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """OpenSSH semantics: first value wins, IdentityFile accumulates, quotes are removed."""
    config: dict[str, Any] = {}
    ignored = []
    for option in options:
        match = SSH_OPTION.fullmatch(option)
        assert match is not None
        key, value = match.group(1).lower(), match.group(2).strip()
        if key not in HONOURED_OPTIONS:
            ignored.append(match.group(1))
            continue
        if key == "proxycommand" and value.lower() == "none":
            config.setdefault(key, None)
            continue
        if value.startswith('"') and value.endswith('"'):
            value = value[1:-1]
        if key == "identityfile":
            config.setdefault(key, []).append(value)
        else:
            config.setdefault(key, value)
    return config, ignored


def check_ssh_options(options: list[str]) -> bool:
    """``False`` if the loader refused the options (cleanly, naming one of them)."""
    cluster = load(
        {"controller": {"path": "/p"}, "workers": [one_worker("/w", ssh={"options": options})]},
        "workers[0].ssh.options[",
    )
    if cluster is None:
        return False
    contexts, ignored = parsed_ssh_config(cluster.workers[0])
    config, expected_ignored = expected_ssh_config(options)
    # One "Host *" block holding exactly the honoured options: nothing injected a
    # second directive, a Host/Match block or a different value.
    assert contexts == [{"host": ["*"], "config": {}}, {"host": ["*"], "config": config}]
    assert [key.strip() for key in ignored] == expected_ignored
    return True


@settings(max_examples=200, deadline=None)
@given(options=st.lists(st.one_of(ssh_options(), hostile), max_size=4))
@example(options=["ProxyJump=a\u2028ProxyCommand=touch PWNED"])
@example(options=["HostName x\x85Port 2", "User=me\u2029IdentityFile=/tmp/k"])
@example(options=["ProxyJump=a\nProxyCommand=touch PWNED"])
def test_ssh_options_become_exactly_the_written_directives(options: list[str]) -> None:
    check_ssh_options(options)


@pytest.mark.parametrize(
    ("option", "accepted"),
    [
        ("ProxyJump =", False),
        ("ConnectTimeout = ", False),
        ("ProxyJump = =bastion", True),
        ("ProxyCommand ssh -W %h:%p -o StrictHostKeyChecking=no bastion", True),
    ],
)
def test_ssh_option_values_are_kept_whole_or_refused(option: str, accepted: bool) -> None:
    """An empty value once crashed paramiko; an ``=`` inside a value was once lost."""
    assert check_ssh_options([option]) == accepted
