"""A process-wide setting of glibc's ``malloc`` that the ``fdattack`` command makes for the vectorised path.

A vectorised step (:mod:`fdattack.engine.vectorised`) allocates and frees activations of several MB per call. By
default glibc hands such blocks back to the system and the next call faults them in again page by page, which on
FedMD's digits clients costs 18% of a round at K = 100. The setting lives here, called by the application
(``fdattack run``, ``fdattack sweep``, the benchmarks), not inside the library calls, so that a project that reuses
fdattack's modules keeps its own allocator settings unless it calls :func:`keep_freed_memory` itself.
"""

from __future__ import annotations

import ctypes
import functools
import platform

#: glibc's ``mallopt`` parameter numbers (``malloc.h``)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


@functools.cache
def keep_freed_memory() -> bool:
    """Let glibc's ``malloc`` serve blocks below 32 MB from its heap and keep up to 256 MB of freed memory for reuse.

    Peak memory is unchanged; the process holds up to 256 MB it would otherwise return. Does nothing (and returns
    False) where the C library is not glibc; once per process.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    return bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 28)) and bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 25))
