"""Answering an attack's queries on the protocol's side: a thread that serves one line while its phase is open.

A :class:`~fdattack.fd.record.PublicQuery` or an :class:`~fdattack.fd.adversary.Adversary` holds a :class:`Line`: a
queue its requests go in by and a queue the answers come back by, nothing else. The answerer (the live networks, the
upload defenses with their seeds, the evasive clients' digests, the public images) and the protocol's own copy of
what was granted live only in the frame of the thread that serves the line (handed to it through a queue it empties,
so its ``Thread`` object holds neither): no module table, attribute, closure or bound method an attack holds leads
to them, and that thread checks every request itself, whatever the attack did to its query. :meth:`Desk.close`
(protocol-side, on the protocol's own objects) stops the thread, after which the line answers only
:class:`~fdattack.fd.record.StaleQueryError`. Frames and ``gc`` still reach the thread's locals; only a process of
its own stops them (issue 47, item 2).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

#: ``request -> answer``, run on the serving thread; it raises to refuse
Answer = Callable[..., Any]


@dataclass(frozen=True)
class Refusal:
    """An error raised on the serving thread, sent back as its type and message only (a traceback would lead to the
    thread's frame, and so to the answerer)."""

    kind: type[Exception]
    message: str
    final: bool = False  # the line is closed: every later ask gets it too


class Line:
    """What an attack holds to ask the protocol: requests go in by one queue, answers come back by another."""

    __slots__ = ("_requests", "_replies")

    def __init__(self, requests: queue.SimpleQueue, replies: queue.SimpleQueue) -> None:
        self._requests, self._replies = requests, replies

    def ask(self, *request: object) -> Any:
        """The answer to ``request``; the serving thread's refusal is raised here (a stale one stays for the next ask)."""
        self._requests.put(request)
        reply = self._replies.get()
        if type(reply) is Refusal:
            if reply.final:
                self._replies.put(reply)  # the line stays closed
            raise reply.kind(reply.message)
        return reply


_STOP = ("stop",)


class Desk:
    """The protocol's end of a :class:`Line`: :meth:`open` starts a thread answering it, :meth:`close` stops it.

    Args:
        stale: the final refusal it gives while closed (a :class:`~fdattack.fd.record.StaleQueryError` naming the phase).
    """

    def __init__(self, stale: Refusal) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._replies: queue.SimpleQueue = queue.SimpleQueue()
        self._stale = stale
        self._thread: threading.Thread | None = None
        self.line = Line(self._requests, self._replies)
        self._replies.put(stale)

    def open(self, answer: Answer) -> None:
        """Answer the line's requests with ``answer`` until :meth:`close` (what was queued while closed is dropped)."""
        self.close()
        for pending in (self._requests, self._replies):
            while not pending.empty():
                pending.get_nowait()
        handoff: queue.SimpleQueue = queue.SimpleQueue()
        handoff.put((answer, self._requests, self._replies))
        self._thread = threading.Thread(target=_serve, args=(handoff,), name="fdattack-answering", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop answering: later asks get the stale refusal (nothing the attack holds can reopen the line)."""
        if self._thread is None:
            return
        self._requests.put(_STOP)
        self._thread.join()
        self._thread = None
        self._replies.put(self._stale)


def _serve(handoff: queue.SimpleQueue) -> None:
    answer, requests, replies = handoff.get()
    while True:
        request = requests.get()
        if request is _STOP:
            return
        try:
            with torch.no_grad():  # answers carry no graph back to a network
                reply = answer(*request)
        except Exception as err:  # every refusal or failure goes back to the asker as type and message
            log.debug("a query was refused", exc_info=True)
            reply = Refusal(type(err), str(err))
        replies.put(reply)
