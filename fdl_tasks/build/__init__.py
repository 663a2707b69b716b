"""The builds: build environments planned from the workers, one backend per
build mode (:mod:`fdl_tasks.build.backends`), the build records that decide
whether cargo runs, the builder and its order, ``inv clean``.

May import the layers below it (``core`` to ``cache``).
"""
