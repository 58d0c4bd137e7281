"""Errors that the CLI turns into one line on stderr and exit status 2."""

from __future__ import annotations


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
