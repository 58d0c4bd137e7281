"""Errors that the CLI turns into one line on stderr and exit status 2."""

from __future__ import annotations

import signal
from types import FrameType


class FdattackError(Exception):
    """Base class for user-facing errors: bad config, data, checkpoint or upload.

    The message must name the offending key, file, client or round and say what is allowed.
    """


class ConfigError(FdattackError):
    """A config key is unknown, of the wrong type, or out of range."""


class DataError(FdattackError):
    """A data folder or file is missing, unreadable or corrupt."""


class CheckpointError(FdattackError):
    """A checkpoint or run directory cannot be used (corrupt file, refused overwrite)."""


class UploadError(FdattackError):
    """A client upload is invalid (NaN/inf), naming the client and round."""


class WorkerError(FdattackError):
    """The attacks' workers cannot be started (``isolation.mode=process``), with what their zygote said."""


class Terminated(SystemExit):
    """A signal asked the run to stop; the exit status is ``128 + signal number`` (SIGTERM: 143).

    ``recorded`` is set once the stop has been reported (in ``exit.json`` and one line), so the CLI says it only once.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name
        self.recorded = False


#: The signal that :func:`raise_terminated` received and no :func:`stop_if_terminated` has raised again yet.
_pending: int | None = None


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A signal handler that raises :class:`Terminated`, so that the program unwinds like on any error.

    Python drops an exception raised while the signal interrupts a weakref callback or a ``__del__`` ("Exception
    ignored in ..."), so the signal is also kept until :func:`stop_if_terminated` raises it again at a safe point.
    """
    global _pending
    _pending = signum
    raise Terminated(signum)


def stop_if_terminated() -> None:
    """Raise :class:`Terminated` for a signal whose first exception was dropped (see :func:`raise_terminated`)."""
    global _pending
    signum, _pending = _pending, None
    if signum is not None:
        raise Terminated(signum)


def forget_terminated() -> None:
    """Drop a pending signal: it has been raised and handled (the command that received it is over)."""
    global _pending
    _pending = None
