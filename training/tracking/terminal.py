"""The terminal is as public as the tracking store: every line the process prints goes through the redaction.

Job logs and CI output are kept and shared, and libraries print what they were given (Hydra repeats every
override when a job fails). Rather than chase each printer, :func:`redact_terminal` wraps ``sys.stdout`` and
``sys.stderr`` once per entry point. Each write is redacted as it comes: holding back partial lines would break
progress bars that redraw with ``\\r``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from training.tracking.redaction import redact_text, remember_overrides


class RedactedStream:
    """A text stream that redacts each write and is otherwise the stream it wraps (``isatty``, ``fileno``...)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text))
        return len(text)  # what the caller handed over, as ``TextIOBase.write`` promises

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def redact_terminal(argv: Sequence[str] | None = None) -> None:
    """Remember ``argv``'s secret overrides and route stdout and stderr through the redaction (once per process)."""
    remember_overrides(sys.argv[1:] if argv is None else argv)
    wrapped = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactedStream):
            wrapped[id(stream)] = RedactedStream(stream)
            setattr(sys, name, wrapped[id(stream)])
    # Handlers made before (``logging.basicConfig`` ahead of the entry point's body) hold the bare stream.
    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    for handler in (h for lg in loggers for h in lg.handlers if isinstance(h, logging.StreamHandler)):
        if id(handler.stream) in wrapped:
            handler.setStream(wrapped[id(handler.stream)])
