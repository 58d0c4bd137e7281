"""fdattack's own log lines: its logger carries its own handler, so its INFO progress and score lines reach stderr as
``%(message)s`` (``[HH:MM:SS] %(message)s`` where stderr is no terminal) whatever a dependency set up (opacus calls
``logging.basicConfig`` at import, which makes a later ``basicConfig`` of ours do nothing and would print our lines
with its timestamp prefix)."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

#: the logger every fdattack module logs under (``getLogger("fdattack")`` or a child, ``getLogger(__name__)``)
LOGGER = logging.getLogger("fdattack")


class _OwnHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` installs (told apart from anyone else's, so it is installed once). It writes
    to whatever ``sys.stderr`` is when a line is logged, not to the stream of the moment it was installed: a command run
    again in one process (a test, a notebook) after its stderr was replaced or closed still logs. A console
    ``StreamHandler``, so that tqdm's redirect while a progress bar shows (:class:`~fdattack.tracking.progress.Progress`)
    takes its place rather than writing each line a second time beside it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


class _LineFormatter(logging.Formatter):
    """``%(message)s`` on a terminal; ``[HH:MM:SS] %(message)s`` where stderr is not one (a batch job's log, a file), so
    that a log read later says when each step ran, as ``fdattack matrix``'s lines do."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        stream = sys.stderr
        if stream is not None and hasattr(stream, "isatty") and stream.isatty():
            return line
        return f"[{time.strftime('%H:%M:%S', time.localtime(record.created))}] {line}"


def configure_logging(level: str) -> logging.Logger:
    """Give fdattack's logger its own stderr handler at ``level`` (a stdlib level name), replacing the one installed by
    an earlier call, and stop its records at it (no second copy through the root logger's handlers)."""
    for handler in [h for h in LOGGER.handlers if isinstance(h, _OwnHandler)]:
        LOGGER.removeHandler(handler)
    handler = _OwnHandler()
    handler.setFormatter(_LineFormatter("%(message)s"))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(getattr(logging, level))
    LOGGER.propagate = False
    return LOGGER
