"""Verify each host's binary over the preflight fan-out, with a short retry for lagging mounts;
what a run's verification comes to (:mod:`fdl_tasks.preflight.login_verdicts`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import attrs

from fdl_tasks.build.build_results import JobResult
from fdl_tasks.config.names import join_path
from fdl_tasks.config.run import Run
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.binary_files import BinaryFacts, binary_facts
from fdl_tasks.core.errors import FdlError
from fdl_tasks.preflight.login_verdicts import (
    check_verified,
    is_error,
    login_error,
    nothing_reached,
)
from fdl_tasks.preflight.probe import HostVerdict
from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.publish.verification import (
    RemoteCopy,
    copy_problems,
    parse_verification,
    verification_script,
)
from fdl_tasks.ssh.outcomes import Failure, Outcome
from fdl_tasks.ssh.remote import Fleet
from fdl_tasks.timings.recording import round_trips


@attrs.frozen(kw_only=True)
class Verification:
    """What verification found (a delivery is how a host gets its binary; this is
    whether it can run it): hosts that see a runnable copy, hosts it could not ask
    (with the reason), every problem that makes a host unable to run it, and hosts
    whose login was refused (an error: a refused host key, a misconfigured login)."""

    verified: tuple[str, ...]
    unverified: Mapping[str, str]
    problems: tuple[str, ...]
    refused: Mapping[str, Failure] = attrs.field(factory=dict)

    def summary(self, meaning: str = " (same bytes, every library resolves)") -> str:
        """``2 verified, 1 not verified: node-c (unreachable: …)`` — never more than is true;
        ``meaning``: what verified means, said after the count."""
        text = f"{len(self.verified)} host(s) verified{meaning}"
        if self.unverified:
            text += f", {len(self.unverified)} not verified: " + "; ".join(
                f"{host} ({why})" for host, why in sorted(self.unverified.items())
            )
        return text


class FirstAsks:
    """Verification's first round trip to a host, asked as soon as its build has ended
    well, while the other builds go on: its binary is final then (the run holds the
    project lock), and only the last build's hosts are left to ask after it.

    A context: leaving it by an exception (a stop) does not wait for the hosts."""

    def __init__(
        self, fleet: Fleet, envelopes: Mapping[str, PerHostEnvelope], hosts: set[str]
    ) -> None:
        self.fleet, self.timeout = fleet, fleet.settings.probe_timeout
        self.scripts = {h: verification_script(fleet.workers[h].path, envelopes[h]) for h in hosts}
        #: The first of the fleet's round trips that are verification's (``--timings``).
        self.mark = len(fleet.rounds)
        self._pool = ThreadPoolExecutor(thread_name_prefix="verify")
        self._asked: list[Future[dict[str, Outcome]]] = []

    def built(self, result: JobResult) -> None:
        """Ask ``result``'s hosts now (a build that ended well)."""
        if hosts := {h: self.scripts[h] for h in result.job.hosts if h in self.scripts}:
            self._asked.append(self._pool.submit(self.fleet.run, hosts, self.timeout))

    def answers(self) -> dict[str, Outcome]:
        """Every answer to what was asked (waited for)."""
        return {host: o for asked in self._asked for host, o in asked.result().items()}

    def __enter__(self) -> FirstAsks:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._pool.shutdown(wait=kind is None, cancel_futures=kind is not None)


def verify_copies(
    fleet: Fleet,
    envelopes: Mapping[str, PerHostEnvelope],
    built: Mapping[str, Path],
    settings: Settings,
    report: Callable[[str], None],
    known: Mapping[Path, BinaryFacts] | None = None,
    answered: Mapping[str, Outcome] | None = None,
) -> Verification:
    """Ask every host about its copy; unreachable hosts are counted as not verified.

    ``built[host]`` is the binary cargo produced for that host's build: its
    digest and glibc need come from ``known`` (its build record's), else each
    distinct build is hashed and parsed once, however many hosts share it,
    beside the first round trip, which waits on the hosts anyway. Every host's
    own copy must match it. ``answered``: the first round trip's answers of the
    hosts asked already (:class:`FirstAsks`).
    """
    scripts = {h: verification_script(fleet.workers[h].path, e) for h, e in envelopes.items()}
    copies: dict[str, RemoteCopy] = {}
    unverified: dict[str, str] = {}
    refused: dict[str, Failure] = {}
    pending = set(envelopes)
    facts = dict(known or {})
    outcomes = {h: o for h, o in (answered or {}).items() if h in pending}
    with ThreadPoolExecutor(1) as side:
        unread = set(built.values()) - facts.keys()
        reading = side.submit(lambda: {source: binary_facts(source) for source in unread})
        unasked = {h: scripts[h] for h in sorted(pending - outcomes.keys())}
        outcomes |= fleet.run(unasked, settings.probe_timeout) if unasked else {}
        facts |= reading.result()
    expected = {h: facts[built[h]].sha256 for h in envelopes}
    needed = {h: facts[built[h]].glibc for h in envelopes}
    for attempt in range(settings.verify_retries + 1):
        if attempt:
            time.sleep(settings.verify_retry_delay)
            outcomes = fleet.run({h: scripts[h] for h in sorted(pending)}, settings.probe_timeout)
        for host, outcome in outcomes.items():
            if isinstance(outcome, Failure) and is_error(outcome.kind, settings.ssh_login_errors):
                refused[host] = outcome
                pending.discard(host)
                continue
            copy = None if isinstance(outcome, Failure) else parse_verification(outcome.stdout)
            if copy is None:
                reason = outcome.reason if isinstance(outcome, Failure) else "no usable answer"
                report(f"verify: {host} not verified: {reason}")
                unverified[host] = reason
                pending.discard(host)
                continue
            copies[host] = copy
            if copy.sha256 == expected[host]:
                pending.discard(host)
        if not pending:
            break
    problems = []
    verified = []
    for host, copy in sorted(copies.items()):
        path = join_path(fleet.workers[host].path, envelopes[host].bin)
        found = copy_problems(host, path, copy, expected[host], needed[host])
        problems += found
        if not found:
            verified.append(host)
    return Verification(
        verified=tuple(verified), unverified=unverified, problems=tuple(problems), refused=refused
    )


def verify_hosts(
    run: Run,
    fleet: Fleet,
    envelopes: dict[str, PerHostEnvelope],
    built: dict[str, Path],
    known: Mapping[Path, BinaryFacts] | None = None,
    first: FirstAsks | None = None,
) -> Verification:
    """Every reachable host must run its binary; a refused login is an error; a host
    down is a warning, unless no host was reached or ``fdl.require_verified`` is all.
    ``first``: the hosts asked already, as their builds ended."""
    answered = first.answers() if first else None
    with round_trips(run, fleet, "verify", since=first.mark if first else None):
        verification = verify_copies(
            fleet, envelopes, built, run.settings, run.report, known, answered
        )
    if verification.refused:
        raise login_error(verification.refused, "delivery verification")
    if verification.problems:
        raise FdlError(
            "delivery verification failed; no envelope was published.\n"
            + "\n".join(f"  {p}" for p in verification.problems)
        )
    run.report(f"verify: {verification.summary()}")
    check_verified(
        len(verification.verified), verification.unverified, run.settings.require_verified
    )
    return verification


def require_verification_possible(run: Run) -> None:
    """``--require-verified`` with ``--no-verify`` would publish what nobody verified."""
    if run.settings.require_verified == "all" and not run.settings.verify:
        raise FdlError(
            "fdl.require_verified (--require-verified) needs verification, but it is off "
            "(--no-verify or fdl.verify false): choose one"
        )


def require_one_reached(run: Run, verdicts: Sequence[HostVerdict]) -> None:
    """No remote host answered preflight: verification could reach none, so build nothing
    (unless ``fdl.require_verified`` is none, or verification is off)."""
    if run.settings.verify and nothing_reached(verdicts, [w.host for w in run.remotes]):
        failed = {v.host: v.warnings[0] if v.warnings else "" for v in verdicts if v.failure}
        check_verified(0, failed, run.settings.require_verified, published=False)
