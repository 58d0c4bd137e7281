"""A worker's file system, network and signals, confined with Linux's Landlock (kernel 5.13+; no privilege needed).

A worker runs as the run's user, so without a sandbox it could open any file the user can: the run directory
(``partition.json``, checkpoints, the evaluation classifier) or ``/proc/<run's pid>``. :func:`confine` restricts the
worker, for good, to reading Python's and the system's files and its own ``/proc/self``, and to writing its state
folder (and its folder of the cache); it may open no TCP connection and signal no process outside its sandbox
(Landlock ABI 4 and 6, where the kernel has them), and start no process, socket or program
(:mod:`~fdattack.isolation.seccomp`). Where Landlock is missing (another OS, an old kernel, a disabled LSM) it confines
no file and says so: the worker then shares the file system with the run.

The kernel interface is three system calls (``landlock_create_ruleset``, ``landlock_add_rule``,
``landlock_restrict_self``), called through ``ctypes``; see the kernel's Documentation/userspace-api/landlock.rst.
"""

from __future__ import annotations

import ctypes
import os
import site
import sys
from pathlib import Path
from typing import Iterable

from fdattack.isolation.seccomp import deny_processes_and_sockets

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every architecture (new syscalls)
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# file-system rights (ABI 1, then REFER in 2, TRUNCATE in 3, IOCTL_DEV in 5)
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_FS = (1 << 13) - 1
_FS_BY_ABI = {1: _ABI1_FS, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | (1 << 14) | (1 << 15)  # those a rule on a file (not a folder) may grant
READ = EXECUTE | READ_FILE | READ_DIR
_NET_TCP = (1 << 0) | (1 << 1)  # bind and connect (ABI 4)
_SCOPED = (1 << 0) | (1 << 1)  # abstract unix sockets and signals (ABI 6)

#: what every worker may read, beside Python's own folders (``sys.prefix``, ``sys.path``)
SYSTEM_READABLE = (
    "/usr",
    "/lib",
    "/lib64",
    "/etc",
    "/opt",
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",
    "/proc/self",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/dev/urandom",
    "/dev/random",
)
#: what a worker on a GPU also reads (the driver's settings and the devices' topology)
DEVICE_READABLE = ("/sys", "/proc/driver")
#: what every worker may write
SYSTEM_WRITABLE = ("/dev/null",)
#: in ``/dev``, what no worker writes, GPU or not: machine-wide memory that no budget counts
_SHARED_MEMORY = ("shm", "mqueue")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers; 0 where there is none."""
    libc = _libc()
    if libc is None:
        return 0
    version = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def python_folders() -> list[Path]:
    """Where Python and its packages are: its prefixes, the site-packages folders, and the top-level package folder of
    every module imported so far (an editable install's or a plugin's source; never a whole ``sys.path`` entry, which
    may hold run directories)."""
    found = {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(), site.getusersitepackages())}
    for name, module in list(sys.modules.items()):
        top = sys.modules.get(name.partition(".")[0], module)
        where = getattr(top, "__file__", None)
        if where:
            path = Path(where)
            found.add(path.parent if path.name == "__init__.py" else path)
    resolved = {p.resolve() for p in found if p.exists()}
    return sorted(p for p in resolved if not any(parent in resolved for parent in p.parents))


def confine(writable: Iterable[Path], readable: Iterable[Path] = (), devices: bool = False) -> int:
    """Restrict this process, for good, to reading :data:`SYSTEM_READABLE`, Python's folders and ``readable``, and to
    reading and writing :data:`SYSTEM_WRITABLE` and ``writable``; no TCP, and no signal or abstract socket outside its
    sandbox, where the kernel can; and no new process, socket or exec
    (:func:`~fdattack.isolation.seccomp.deny_processes_and_sockets`, also where Landlock is missing). ``devices``: also
    list ``/dev``, read, write and ``ioctl`` what is in it (a GPU's device files) but ``/dev/shm`` and ``/dev/mqueue``,
    and read :data:`DEVICE_READABLE`.

    Landlock and seccomp confine the calling thread and the threads it starts afterwards, not a thread already running:
    the process must have one thread only.

    Returns:
        The Landlock ABI used; 0 when the kernel offers none (no file was confined).

    Raises:
        RuntimeError: the process has more than one thread.
        OSError: the kernel refused a rule or a restriction (a folder that is neither file nor folder).
    """
    _single_threaded()
    abi = landlock_abi()
    libc = _libc()
    if libc is None:
        return 0
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
    if abi:
        _restrict(libc, abi, writable, readable, devices)
    deny_processes_and_sockets()
    return abi


def _single_threaded() -> None:
    """Raise RuntimeError if this process has more than one thread (where ``/proc`` shows them)."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return
    if threads > 1:
        raise RuntimeError(f"cannot confine a process of {threads} threads: the threads already running would stay unconfined")


def _restrict(libc: ctypes.CDLL, abi: int, writable: Iterable[Path], readable: Iterable[Path], devices: bool) -> None:
    """Restrict this thread, and those it starts, with Landlock ABI ``abi`` (see :func:`confine`)."""
    handled = _FS_BY_ABI.get(abi, _FS_BY_ABI[5])
    attr = _RulesetAttr(handled, _NET_TCP if abi >= 4 else 0, _SCOPED if abi >= 6 else 0)
    size = ctypes.sizeof(ctypes.c_uint64) * (3 if abi >= 6 else 2 if abi >= 4 else 1)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _error("landlock_create_ruleset")
    try:
        for path in [*SYSTEM_READABLE, *python_folders(), *readable, *(DEVICE_READABLE if devices else ())]:
            _allow(libc, ruleset, Path(path), READ & handled)
        for path in [*SYSTEM_WRITABLE, *writable, *(_device_files() if devices else [])]:
            _allow(libc, ruleset, Path(path), handled)
        if devices:
            _allow(libc, ruleset, Path("/dev"), READ_DIR)  # list it, as a driver may
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset)


def _device_files() -> list[Path]:
    """What a worker on a GPU may read, write and ``ioctl``: each entry of ``/dev`` but the shared memory folders and the
    links (``/dev/stdout`` leads to the worker's log)."""
    return [path for path in Path("/dev").iterdir() if path.name not in _SHARED_MEMORY and not path.is_symlink()]


def _allow(libc: ctypes.CDLL, ruleset: int, path: Path, access: int) -> None:
    """Grant ``access`` beneath ``path`` (a file gets only the rights a file can have); a missing path is skipped."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not path.is_dir():
            access &= _FILE_RIGHTS
        rule = _PathBeneathAttr(access, fd)
        if libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise _error(f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _error(call: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{call}: {os.strerror(errno)}")
