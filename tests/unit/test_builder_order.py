"""Which builds wait for another: only a cold compile cache is worth a head start."""

from __future__ import annotations

import pytest

from fdl_tasks.builder import head_start


@pytest.mark.parametrize(
    ("cached", "cold", "builds", "expected"),
    [
        (True, True, 3, 1),  # the first build warms the cache for the other two
        (False, True, 3, 0),  # no cache (off, or sccache missing): nothing to warm
        (True, False, 3, 0),  # a target dir exists: the head start would only cost time
        (True, True, 1, 0),  # one build waits for nobody
    ],
)
def test_only_a_cold_cache_gets_a_head_start(
    cached: bool, cold: bool, builds: int, expected: int
) -> None:
    assert head_start(cached=cached, cold=cold, builds=builds) == expected
