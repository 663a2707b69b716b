"""fdl-tasks: pre-build a Rust command once per remote GPU host, against its own libtorch.

The public API is what ``__all__`` names (docs/compose.md shows it in use):

- ``ns``, the Invoke collection, as your root collection (``from fdl_tasks
  import ns``) or nested (``ns.add_collection(fdl_tasks.ns, "fdl")``); each
  task is also importable from :mod:`fdl_tasks.tasks` (``prebuild``,
  ``preflight``, ``build_host``, ``launch``, ``clean``, ``push_libtorch``);
- :func:`prebuild` and :func:`preflight`, typed functions that run the same
  steps from your own task, on any thread, taking a :class:`Settings` (or
  ``c.config.fdl``; :func:`settings_of`) and returning frozen values of their
  own (:class:`Published` with each :class:`HostBinary`, :class:`Verdict`);
- :class:`FdlError` and :class:`Stopped`, what those functions raise.

Importing it changes nothing in the process: no ``sys.excepthook``, no signal
handler, no environment variable (:mod:`fdl_tasks.cli` says when the tasks do).
Every other module is internal and may change between releases.
"""

from fdl_tasks.inv_process import pause_collection

pause_collection()  # only while ``inv`` loads the tasks (fdl_tasks.inv_process)

from fdl_tasks.api import HostBinary, Published, Settings, Verdict, prebuild, preflight, settings_of  # noqa: E402
from fdl_tasks.core.errors import FdlError, Stopped  # noqa: E402
from fdl_tasks.tasks import ns  # noqa: E402

__all__ = [
    "FdlError",
    "HostBinary",
    "Published",
    "Settings",
    "Stopped",
    "Verdict",
    "ns",
    "prebuild",
    "preflight",
    "settings_of",
]
