"""One backend per build mode: native cargo, ``docker run``, docker compose.

The rest of the code never asks which mode it is in: it asks the run's
backend (:func:`fdl_tasks.backends.registry.backend_for`, typed by
:class:`fdl_tasks.backends.protocol.Backend`). A new mode is a new module
here and one line in :data:`fdl_tasks.backends.registry.BACKENDS`.
"""
