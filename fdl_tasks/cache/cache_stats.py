"""What one build got from the compile cache and the build servers: the counts a
build leaves in its target dir (see :func:`fdl_tasks.cache.compile_cache.with_stats`), read back."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from fdl_tasks.cache.dist import fallback_units, parse_dist_status
from fdl_tasks.core.atomic_files import text_or_empty
from fdl_tasks.core.console import listed

#: Each build writes its hit counts here, in its target dir.
STATS_FILE = "sccache-stats.json"
#: ... and, with distributed compiles, sccache's view of the scheduler from inside the build
DIST_STATUS_FILE = "sccache-dist-status.json"
#: ... and the units compiled locally after their attempt through sccache failed.
FALLBACKS_FILE = "sccache-dist-fallbacks.txt"


@attrs.frozen
class CacheStats:
    """What one build got from the cache, and with distributed compiles from the build
    servers: ``dist`` is what sccache said of the scheduler from inside the build
    (``SchedulerStatus`` when connected, ``NotConnected``…), ``None`` without dist;
    ``remote`` its remote compiles, ``dist_errors`` remote attempts it compiled locally
    itself, ``fallbacks`` the units the wrapper compiled locally after a failure."""

    hits: int
    misses: int
    write_errors: int
    dist: str | None = None
    remote: int = 0
    dist_errors: int = 0
    fallbacks: tuple[str, ...] = ()

    @property
    def compiled(self) -> int:
        """Units compiled (not answered from the cache), the local fallbacks included."""
        return self.misses + len(self.fallbacks)

    @property
    def remote_ok(self) -> int:
        """Units whose object came from a build server."""
        return max(0, self.remote - len(self.fallbacks))

    def describe(self) -> str:
        calls = self.hits + self.misses
        text = f"{self.hits}/{calls} hits" if calls else "no cacheable calls"
        if self.dist is not None and self.dist != "Disabled" and self.compiled:
            text += f", dist {self.remote_ok}/{self.compiled}"
            if self.dist == "NotConnected":
                text += " (scheduler unreachable from the build)"
            elif self.dist_errors:
                text += f" ({self.dist_errors} failed remotely, compiled here)"
        if self.fallbacks:
            text += f", compiled locally after a failure: {listed(self.fallbacks, 3)}"
        return text + (f", {self.write_errors} write errors" if self.write_errors else "")


def read_stats(target_dir: Path) -> CacheStats | None:
    """The counts a build left in its target dir (``None`` if it left none)."""
    try:
        data = json.loads((target_dir / STATS_FILE).read_text(encoding="utf-8"))
        stats = data["stats"]
        hits = sum(stats["cache_hits"]["counts"].values())
        misses = sum(stats["cache_misses"]["counts"].values())
        remote = sum(stats.get("dist_compiles", {}).values())
        dist_errors = int(stats.get("dist_errors", 0))
        write_errors = int(stats.get("cache_write_errors", 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return CacheStats(
        hits,
        misses,
        write_errors,
        dist=parse_dist_status(text_or_empty(target_dir / DIST_STATUS_FILE)),
        remote=remote,
        dist_errors=dist_errors,
        fallbacks=fallback_units(text_or_empty(target_dir / FALLBACKS_FILE)),
    )
