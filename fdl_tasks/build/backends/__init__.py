"""One backend per build mode: native cargo, ``docker run``, docker compose.

The rest of the code never asks which mode it is in: it asks the run's
backend (:func:`fdl_tasks.build.backends.registry.backend_for`, typed by
:class:`fdl_tasks.build.backends.protocol.Backend`). A new mode is a new module
here and one line in :data:`fdl_tasks.build.backends.registry.BACKENDS`.
"""
