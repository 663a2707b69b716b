"""This repository's own tasks: the fdl-tasks collection as the root namespace."""

from fdl_tasks import ns

__all__ = ["ns"]
