"""What the two container modes share: a build is stopped by removing its containers."""

from __future__ import annotations

from fdl_tasks.build_argv import JOB_LABEL, RUN_LABEL
from fdl_tasks.build_environment import BuildJob
from fdl_tasks.build_stamps import StampInputs
from fdl_tasks.docker_tools import remove_containers


class ContainerBackend:
    """Stopping a ``docker`` client leaves its container running: remove the container,
    found by the run's and the job's labels, and the client exits with it."""

    killers = (
        "docker kill or docker stop, the out-of-memory killer, or the Docker daemon "
        "stopping or restarting (it stops every container)"
    )

    run_id: str

    def stop_job(self, job: BuildJob, process: int | None) -> list[str]:
        return remove_containers(f"{RUN_LABEL}={self.run_id}", f"{JOB_LABEL}={job.name}")

    def stop_run(self) -> list[str]:
        return remove_containers(f"{RUN_LABEL}={self.run_id}")

    def stamp_inputs(self, job: BuildJob) -> StampInputs | None:
        """None: a compose service (its volumes, its env files) may read anything."""
        return None

    def run_note(self) -> str:
        return f"containers labelled {RUN_LABEL}={self.run_id}"
