"""Per-row file work (checks, decodes) on a thread pool, in tasks of many rows.

Why tasks of rows: a task and its future per row cost about a third of checking a 270k-row release
(docs/scaling.md, "At release scale"); the file reads release the GIL, so threads still overlap them.
"""

from __future__ import annotations

import datetime
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

#: Rows a thread handles per task.
CHUNK = 512


def row_problems(attempt: Callable[[int], str | None], n: int, workers: int,
                 progress: Callable[[int, int], None] | None = None) -> list[str]:  # fmt: skip
    """``attempt(i)`` for every row ``i < n`` on ``workers`` threads; the messages it returned, in row order.
    ``progress(rows done, n)`` is called as each task of rows ends."""
    done, lock = 0, threading.Lock()

    def attempt_chunk(begin: int) -> list[str]:
        nonlocal done
        found = [message for index in range(begin, min(begin + CHUNK, n)) if (message := attempt(index))]
        if progress is not None:
            with lock:
                done += min(CHUNK, n - begin)
                progress(done, n)
        return found

    with ThreadPoolExecutor(workers) as pool:
        return [message for chunk in pool.map(attempt_chunk, range(0, n, CHUNK)) for message in chunk]


def progress_lines(what: str, interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
    """A ``progress`` for :func:`row_problems` that writes ``files: 12,288 of 143,000 decoded, 410/s, ETA 0:05:18``
    on stderr whenever ``interval_s`` passed without a line: a full decode of a large release takes minutes."""
    started = last = clock()

    def report(done: int, total: int) -> None:
        nonlocal last
        now = clock()
        if now - last < interval_s:
            return
        last = now
        rate = done / (now - started)
        eta = datetime.timedelta(seconds=round((total - done) / rate))
        print(f"files: {done:,} of {total:,} {what}, {rate:,.0f}/s, ETA {eta}", file=sys.stderr, flush=True)

    return report
