"""The project's files as a snapshot: what counts as a source, a walk that skips
``target/`` and tool caches, stats with content digests for what a stat
cannot decide. One library for the build records and for ``--watch``.

May import the layers below it (``core`` to ``timings``).
"""
