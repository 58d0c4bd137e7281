"""fdattack's own log lines: its logger carries its own handler, so its INFO progress and score lines reach stderr as
``%(message)s`` whatever a dependency set up (opacus calls ``logging.basicConfig`` at import, which makes a later
``basicConfig`` of ours do nothing and would print our lines with its timestamp prefix)."""

from __future__ import annotations

import logging
import sys

#: the logger every fdattack module logs under (``getLogger("fdattack")`` or a child, ``getLogger(__name__)``)
LOGGER = logging.getLogger("fdattack")


class _OwnHandler(logging.Handler):
    """The handler :func:`configure_logging` installs (told apart from anyone else's, so it is installed once). It writes
    to whatever ``sys.stderr`` is when a line is logged, not to the stream of the moment it was installed: a command run
    again in one process (a test, a notebook) after its stderr was replaced or closed still logs."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging's own contract: a failing handler reports and never raises
            self.handleError(record)


def configure_logging(level: str) -> logging.Logger:
    """Give fdattack's logger its own stderr handler at ``level`` (a stdlib level name), replacing the one installed by
    an earlier call, and stop its records at it (no second copy through the root logger's handlers)."""
    for handler in [h for h in LOGGER.handlers if isinstance(h, _OwnHandler)]:
        LOGGER.removeHandler(handler)
    handler = _OwnHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(getattr(logging, level))
    LOGGER.propagate = False
    return LOGGER
