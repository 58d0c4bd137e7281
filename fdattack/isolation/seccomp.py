"""A worker's system calls: no new process, no new socket, no exec, filtered with seccomp-BPF (Linux 3.5+, no privilege
once ``no_new_privs`` is set).

Landlock (:mod:`~fdattack.isolation.sandbox`) confines files, TCP and signals, not processes or other sockets: a worker
could fork a child that the memory budget (per pid) does not see and that, in a session of its own, outlives the run;
and two workers could talk over UDP or a unix datagram socket. A worker needs neither: it computes in threads, and its
channel to the run is a descriptor it already holds. :func:`deny_processes_and_sockets` therefore makes these calls fail:

- ``fork``, ``vfork``, and ``clone`` without ``CLONE_THREAD``: EPERM (a thread, ``CLONE_THREAD``, is allowed: torch's
  thread pools and Python's threads keep working);
- ``clone3``: ENOSYS, whose flags lie in memory a filter cannot read; glibc then falls back to ``clone``, judged above;
- ``socket``, ``socketpair``: EPERM; ``io_uring_setup``: EPERM (an io_uring opens sockets without ``socket``);
  ``memfd_create``: EPERM (memory written to a memfd and never mapped is counted by no memory budget);
- ``execve``, ``execveat``: EPERM. A worker never execs: traced, a run's workers made no ``execve`` (the imports that
  run a program, ``ctypes.util.find_library``'s ``ldconfig`` and NumPy's ``lscpu``, run in the zygote, before any
  filter, and would need a ``fork`` first; both take its failure as "not found").

Everything else is allowed. A call of another ABI than the filter's (32-bit ``int 0x80`` on x86_64, x32, AArch32)
fails with EPERM, so that no other system-call table bypasses the numbers above. The filter is written by hand as
classic BPF over ``struct seccomp_data`` and installed with ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)``; see the
kernel's Documentation/userspace-api/seccomp_filter.rst. Like Landlock, it holds for the calling thread and the threads
it starts afterwards, for good.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from pathlib import Path

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_J*|BPF_K, BPF_RET|BPF_K
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low 32 bits: both ABIs are little-endian)
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000  # x86_64's x32 calls carry AUDIT_ARCH_X86_64 and this bit in their number

#: per machine: its AUDIT_ARCH, the calls denied with EPERM, ``clone``, ``clone3``, and whether it has the x32 ABI
_ABIS = {
    "x86_64": (
        0xC000003E,
        {
            "fork": 57,
            "vfork": 58,
            "socket": 41,
            "socketpair": 53,
            "execve": 59,
            "execveat": 322,
            "io_uring_setup": 425,
            "memfd_create": 319,
        },
        56,
        435,
        True,
    ),
    "aarch64": (
        0xC00000B7,
        {"socket": 198, "socketpair": 199, "execve": 221, "execveat": 281, "io_uring_setup": 425, "memfd_create": 279},
        220,
        435,
        False,
    ),
}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _program(arch: int, denied: list[int], clone: int, clone3: int, x32: bool) -> list[tuple[int, int, int, int]]:
    """The filter's instructions, ``(code, jt, jf, k)``; a jump's target is a label (``allow``, ``eperm``, ``enosys``,
    the three returns at its end) resolved to an offset, or None for the next instruction."""
    body: list[tuple[int, str | None, str | None, int]] = [(_LD_W_ABS, None, None, _ARCH), (_JEQ_K, None, "eperm", arch)]
    body += [(_LD_W_ABS, None, None, _NR)] + ([(_JGE_K, "eperm", None, _X32_BIT)] if x32 else [])
    body += [(_JEQ_K, "eperm", None, number) for number in denied]
    body += [(_JEQ_K, "enosys", None, clone3), (_JEQ_K, None, "allow", clone)]
    body += [(_LD_W_ABS, None, None, _ARG0), (_JSET_K, "allow", "eperm", _CLONE_THREAD)]
    labels = {"allow": len(body), "eperm": len(body) + 1, "enosys": len(body) + 2}
    returns = [(_RET_K, 0, 0, _ALLOW), (_RET_K, 0, 0, _ERRNO | errno.EPERM), (_RET_K, 0, 0, _ERRNO | errno.ENOSYS)]
    return [(code, _offset(jt, at, labels), _offset(jf, at, labels), k) for at, (code, jt, jf, k) in enumerate(body)] + returns


def _offset(target: str | None, at: int, labels: dict[str, int]) -> int:
    return 0 if target is None else labels[target] - at - 1


def filter_supported() -> bool:
    """Whether :func:`deny_processes_and_sockets` has a filter for this OS, machine and Python."""
    return sys.platform.startswith("linux") and platform.machine() in _ABIS and ctypes.sizeof(ctypes.c_void_p) == 8


def filtered(pid: int) -> bool | None:
    """Whether process ``pid`` runs under a seccomp filter (``Seccomp: 2`` in its ``/proc/<pid>/status``); None where
    that cannot be read. What the run checks of a worker rather than take the worker's word for it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Seccomp:"):
                return line.split()[1] == "2"
    except (OSError, IndexError):
        pass
    return None


def deny_processes_and_sockets() -> bool:
    """Install the filter on this thread (and the threads it starts), for good; ``no_new_privs`` must be set already.

    Returns:
        Whether it was installed: False on another OS or machine (or a 32-bit Python), or a kernel without seccomp
        filters.

    Raises:
        OSError: the kernel refused the filter for another reason (``no_new_privs`` unset, without ``CAP_SYS_ADMIN``).
    """
    if not filter_supported():  # a 32-bit Python on a 64-bit kernel calls another ABI
        return False
    arch, denied, clone, clone3, x32 = _ABIS[platform.machine()]
    program = _program(arch, list(denied.values()), clone, clone3, x32)
    instructions = (_SockFilter * len(program))(*(_SockFilter(*instruction) for instruction in program))
    fprog = _SockFprog(len(program), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0:
        return True
    error = ctypes.get_errno()
    if error == errno.EINVAL:  # the kernel has no CONFIG_SECCOMP_FILTER
        return False
    raise OSError(error, f"prctl(PR_SET_SECCOMP): {os.strerror(error)}")
