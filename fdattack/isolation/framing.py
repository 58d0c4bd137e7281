"""The run's reading of a worker's messages: never waiting, under a size limit, with the age of a message begun.

A worker writes its messages with :meth:`multiprocessing.connection.Connection.send_bytes` (a 4-byte big-endian length,
or -1 and an 8-byte one, then the bytes). The run does not read them with ``recv_bytes``, which waits for the whole
message (forever, for a body that never comes, while every other worker waits too) and takes any length it is told.
:class:`MessageReader` takes what has arrived and returns a message once whole, refuses a length over its limit before
reading a byte of the body, and says since when a message has been begun (the run stops a worker whose message takes
too long: :data:`fdattack.isolation.proxy.MESSAGE_S`).
"""

from __future__ import annotations

import os
import select
import struct
import time
from typing import Optional


class MessageError(ValueError):
    """A message whose length is over the reader's limit."""


class MessageReader:
    """Reads the messages on descriptor ``fd`` as they arrive, without waiting.

    Args:
        fd: the run's end of a worker's channel.
        limit: the most bytes one message may hold.
    """

    def __init__(self, fd: int, limit: int) -> None:
        self._fd, self.limit = fd, limit
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._reset()

    def _reset(self) -> None:
        self._head = bytearray()
        self._body: Optional[bytearray] = None
        self._got = 0
        self.begun: Optional[float] = None  # when the first byte of the message being read arrived

    @property
    def size(self) -> Optional[int]:
        """The length of the message being read, once its header is in."""
        return None if self._body is None else len(self._body)

    def read(self) -> Optional[bytearray]:
        """The next message if it has arrived whole (reading what is there); None while it has not.

        Raises:
            MessageError: its length is over :attr:`limit`.
            EOFError: the worker closed its end.
        """
        while True:
            if self._body is not None and self._got == len(self._body):
                message = self._body
                self._reset()
                return message
            if not self._poller.poll(0):
                return None
            if self._body is None:
                self._read_header()
                continue
            got = os.readv(self._fd, [memoryview(self._body)[self._got :]])
            if got == 0:
                raise EOFError("the worker closed its channel")
            self._got += got

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for bytes to read."""
        self._poller.poll(max(0, int(seconds * 1000)))

    def _read_header(self) -> None:
        need = 12 if self._head[:4] == b"\xff\xff\xff\xff" else 4
        chunk = os.read(self._fd, need - len(self._head))
        if not chunk:
            raise EOFError("the worker closed its channel")
        self.begun = self.begun or time.monotonic()
        self._head += chunk
        if len(self._head) == 4 and self._head != b"\xff\xff\xff\xff":
            self._start(struct.unpack("!i", self._head)[0])
        elif len(self._head) == 12:
            self._start(struct.unpack("!Q", self._head[4:])[0])

    def _start(self, size: int) -> None:
        if size < 0 or size > self.limit:
            raise MessageError(f"a message of {size} bytes, over the limit of {self.limit}")
        self._body = bytearray(size)


def read_message(reader: MessageReader, deadline: float) -> bytearray:
    """The next message of ``reader``, waiting for it until ``time.monotonic()`` reaches ``deadline``.

    Raises:
        TimeoutError: none arrived whole by then.
        MessageError, EOFError: as :meth:`MessageReader.read`.
    """
    while True:
        message = reader.read()
        if message is not None:
            return message
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no whole message in time")
        reader.wait(min(left, 0.2))
