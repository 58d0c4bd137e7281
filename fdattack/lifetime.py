"""A child process that ends with its parent, however the parent ends (a ``kill -9`` runs none of its handlers)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

#: prctl's option that has the kernel signal a process when its parent exits (linux/prctl.h)
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> None:
    """Have the kernel kill this process when its parent ends (Linux ``PR_SET_PDEATHSIG``; nothing elsewhere), and leave
    at once where the parent (``parent``'s pid, or the one found now) ended before the request took hold. The signal
    comes when the parent's thread that started this process ends: a parent whose starting threads may end before it
    needs a watch of its own besides (:func:`fdattack.matrix.stopping.die_with_parent`)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if parent is None else parent
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
