"""The ground floor: what every layer needs and that knows nothing of clusters.

Owns the errors and their exit codes, the console (status board, tables),
atomic file writes, the one ``flock`` helper, the SIGTERM-as-Ctrl-C handler,
the report lines and their severities, "did you mean", the notes said once,
the ``--timings`` timeline and what a built binary says of itself (digest,
CPU, glibc). Imports nothing from the rest of ``fdl_tasks``.
"""
