"""From builds to what a launcher reads: copy delivery, verification, the
envelope and its sidecar, and :mod:`~fdl_tasks.publish.pipeline`, the one path
of ``prebuild``, ``build-host`` and each watch cycle.

May import every layer below it (``core`` to ``preflight``).
"""
