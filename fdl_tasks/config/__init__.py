"""What the user asked for: the cluster file (ours or flodl's layered ``fdl.yml``),
the ``fdl`` settings, variants, every path under ``target/cluster/``, the
launch mode, and :class:`~fdl_tasks.config.run.Run`, one task invocation.

Pure but for reading the user's files. May import ``core``, ``gpu``, ``cargo``.
"""
