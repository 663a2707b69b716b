"""What the two container modes share: a build is stopped by removing its containers."""

from __future__ import annotations

from fdl_tasks.build_argv import JOB_LABEL, RUN_LABEL
from fdl_tasks.build_environment import BuildJob
from fdl_tasks.cache import CompileCache
from fdl_tasks.docker_tools import remove_containers


class ContainerBackend:
    """Stopping a ``docker`` client leaves its container running: remove the container,
    found by the run's and the job's labels, and the client exits with it."""

    killers = (
        "docker kill or docker stop, the out-of-memory killer, or the Docker daemon "
        "stopping or restarting (it stops every container)"
    )

    def stop_job(
        self, job: BuildJob, run_id: str, process: int | None, cache: CompileCache | None
    ) -> list[str]:
        return remove_containers(f"{RUN_LABEL}={run_id}", f"{JOB_LABEL}={job.name}")

    def stop_run(self, run_id: str) -> list[str]:
        return remove_containers(f"{RUN_LABEL}={run_id}")

    def run_note(self, run_id: str) -> str:
        return f"containers labelled {RUN_LABEL}={run_id}"
