"""What the two container modes share: a build is stopped by removing its containers."""

from __future__ import annotations

from fdl_tasks.build.backends.protocol import RunBackend
from fdl_tasks.build.build_argv import JOB_LABEL, RUN_LABEL
from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.docker_tools import remove_containers
from fdl_tasks.build.warm_containers import WARM_LABEL

#: What the docker client prints when its daemon goes away under a running build.
DAEMON_LOST = (
    "error waiting for container",
    "Cannot connect to the Docker daemon",
    "unexpected EOF",
    "connection reset by peer",
)


def docker_exit_problem(exit_code: int, log_tail: str) -> str | None:
    """The docker client's own failure (exit 125: it could not run the container, or lost
    its daemon while waiting for it), said as docker's, not cargo's; ``None`` otherwise."""
    if exit_code != 125:
        return None
    errors = [line.strip() for line in log_tail.splitlines() if "rror" in line]
    said = f": {errors[-1]}" if errors else ""
    if any(marker in log_tail for marker in DAEMON_LOST):
        return f"docker exited 125 (the Docker daemon went away while the build ran{said})"
    return f"docker exited 125 (docker could not run the build{said})"


class ContainerBackend(RunBackend):
    """Stopping a ``docker`` client leaves its container running: remove the container,
    found by the run's and the job's labels, and the client exits with it. A build in a
    warm container is killed inside it (stopping ``docker exec`` would leave it running)."""

    killers = (
        "docker kill or docker stop, the out-of-memory killer, or the Docker daemon "
        "stopping or restarting (it stops every container)"
    )

    def exit_problem(self, exit_code: int, log_tail: str) -> str | None:
        return docker_exit_problem(exit_code, log_tail)

    def stop_job(self, job: BuildJob, process: int | None) -> list[str]:
        warm = self.warm.stop_build(job.name) if self.warm else []
        return warm + remove_containers(f"{RUN_LABEL}={self.run_id}", f"{JOB_LABEL}={job.name}")

    def stop_run(self) -> list[str]:
        warm = self.warm.stop_all() if self.warm else []
        return warm + remove_containers(f"{RUN_LABEL}={self.run_id}")

    def run_note(self) -> str:
        if self.warm is not None:
            where = f"{WARM_LABEL}={self.controller.path}"
            return f"each a docker exec in a warm container labelled {where}"
        return f"containers labelled {RUN_LABEL}={self.run_id}"
