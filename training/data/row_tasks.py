"""Per-row file work (checks, decodes) on a thread pool, in tasks of many rows.

Why tasks of rows: a task and its future per row cost about a third of checking a 270k-row release
(docs/scaling.md, "At release scale"); the file reads release the GIL, so threads still overlap them.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

#: Rows a thread handles per task.
CHUNK = 512


def row_problems(attempt: Callable[[int], str | None], n: int, workers: int) -> list[str]:
    """``attempt(i)`` for every row ``i < n`` on ``workers`` threads; the messages it returned, in row order."""

    def attempt_chunk(begin: int) -> list[str]:
        return [message for index in range(begin, min(begin + CHUNK, n)) if (message := attempt(index))]

    with ThreadPoolExecutor(workers) as pool:
        return [message for chunk in pool.map(attempt_chunk, range(0, n, CHUNK)) for message in chunk]
