"""What an ssh failure and a run's verification come to: error or warning, and which
error (its exit code). Pure; the preflight and the pipeline apply it.

- A refused host key is always an error (it may be a man in the middle).
- A configuration mistake (:data:`~fdl_tasks.ssh.outcomes.CONFIG_KINDS`: a key the host
  refuses, an identity file that is not a private key, a port where no SSH server
  answers) is an error, :class:`~fdl_tasks.core.errors.LoginRefused` (exit 4), unless
  ``fdl.ssh_login_errors`` is ``warn``: flodl's behaviour, a warning like a host down.
- A host down is a warning; but with verification asked for, hosts to ask and not one
  reached, nothing is published: :class:`~fdl_tasks.core.errors.NothingVerified` (exit 5),
  unless ``fdl.require_verified`` is ``none``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from fdl_tasks.core.errors import FdlError, LoginRefused, NothingVerified
from fdl_tasks.preflight.probe import HostVerdict
from fdl_tasks.ssh.outcomes import CONFIG_KINDS, Failure, FailureKind


def is_error(kind: FailureKind, login_errors: str) -> bool:
    """Whether a failure of that kind is an error (``login_errors``: the setting)."""
    return kind is FailureKind.HOST_KEY or (kind in CONFIG_KINDS and login_errors == "error")


def failed_verdict(host: str, data_path: str, failure: Failure, login_errors: str) -> HostVerdict:
    """The verdict of a host that could not be asked at all."""
    kind = failure.kind
    if is_error(kind, login_errors):
        return HostVerdict(
            host, "error", (failure.reason,), (), None, data_path, failure=kind.value
        )
    if kind in CONFIG_KINDS:
        warning = f"{failure.reason} (a warning: fdl.ssh_login_errors is warn)"
    elif kind is FailureKind.GATEWAY:  # the host was not asked: nothing known of it
        warning = failure.reason
    else:
        warning = f"unreachable: {failure.reason}"
    return HostVerdict(host, "warning", (), (warning,), None, data_path, failure=kind.value)


def preflight_error(failed: Sequence[HostVerdict]) -> type[FdlError]:
    """The error for hosts with errors: :class:`LoginRefused` if one is a refused login."""
    config = {k.value for k in CONFIG_KINDS}
    return LoginRefused if any(v.failure in config for v in failed) else FdlError


def login_error(refused: Mapping[str, Failure], what: str) -> FdlError:
    """Hosts whose login was refused during ``what``: one paragraph naming each."""
    kind = LoginRefused if any(f.kind in CONFIG_KINDS for f in refused.values()) else FdlError
    return kind(
        f"{what} could not log in to {len(refused)} host(s); no envelope was published:\n"
        + "\n".join(f"  {host}: {f.reason}" for host, f in sorted(refused.items()))
    )


def nothing_reached(verdicts: Sequence[HostVerdict], remotes: Collection[str]) -> bool:
    """Every remote host failed to answer preflight (there is at least one)."""
    failed = {v.host for v in verdicts if v.failure is not None}
    return bool(remotes) and set(remotes) <= failed


def check_verified(
    verified: int, unverified: Mapping[str, str], requirement: str, published: bool = True
) -> None:
    """Raise when verification reached fewer hosts than ``fdl.require_verified`` asks."""
    said = "; ".join(f"{h} ({why})" for h, why in sorted(unverified.items()))
    outcome = "no envelope was published" if published else "nothing was built"
    if requirement != "none" and unverified and not verified:
        raise NothingVerified(
            f"no host could be asked to verify its copy ({len(unverified)} not verified), "
            f"so {outcome}: {said}. If the hosts are down on purpose, publish anyway "
            "with fdl.require_verified none (INVOKE_FDL_REQUIRE_VERIFIED=none)"
        )
    if requirement == "all" and unverified:
        raise FdlError(
            f"{len(unverified)} host(s) not verified and fdl.require_verified is on; "
            f"{outcome}: {said}"
        )
