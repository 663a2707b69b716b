"""fdl-tasks: pre-build a Rust command once per remote GPU host, against its own libtorch.

The public API is what ``__all__`` names (docs/compose.md shows it in use):

- ``ns``, the Invoke collection, as your root collection (``from fdl_tasks
  import ns``) or nested (``ns.add_collection(fdl_tasks.ns, "fdl")``); each
  task is also importable from :mod:`fdl_tasks.tasks` (``prebuild``,
  ``preflight``, ``build_host``, ``launch``, ``clean``, ``push_libtorch``);
- :func:`prebuild` and :func:`preflight`, typed functions that run the same
  steps from your own task and return what they did
  (:class:`~fdl_tasks.publish.pipeline.Published`, :class:`~fdl_tasks.preflight.probe.Verdict`);
- :class:`FdlError` and :class:`Stopped`, what those functions raise.

Every other module is internal and may change between releases.
"""

from fdl_tasks.api import Published, Verdict, prebuild, preflight
from fdl_tasks.core.errors import FdlError, Stopped
from fdl_tasks.tasks import ns

__all__ = ["FdlError", "Published", "Stopped", "Verdict", "ns", "prebuild", "preflight"]
