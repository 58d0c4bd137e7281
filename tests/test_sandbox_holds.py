"""What a confined worker cannot do (:func:`fdattack.isolation.sandbox.confine`), and how its memory is counted.

An audit found that a worker could fork a child that the memory budget did not see and that outlived the run, talk to
another worker over UDP or a unix datagram socket, and write ``/dev/shm``; and that its memory, counted as VmRSS, held
the pages it shares with the zygote. Each test runs a snippet in a fresh interpreter that confines itself to writing
``tmp_path`` and then tries one of these; each prints ``<what> <outcome>`` lines (the name of the OSError raised, or
``done``).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fdattack.isolation.sandbox import landlock_abi
from tests.conftest import REPO

#: what every snippet starts with: torch imported (as in a worker) and ``outcome``
PRELUDE = """
import os, socket, subprocess, sys, threading
from pathlib import Path
import torch
torch.set_num_threads(1)
from fdattack.isolation.sandbox import confine
HERE = Path(sys.argv[1])

def outcome(what, action):
    try:
        action()
    except OSError as error:
        print(what, type(error).__name__, flush=True)
    else:
        print(what, "done", flush=True)
"""

needs_seccomp = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or platform.machine() not in ("x86_64", "aarch64")
    or not Path("/proc/sys/kernel/seccomp/actions_avail").exists(),
    reason="no seccomp filters here (Linux 4.14+ on x86_64 or aarch64)",
)
needs_landlock = pytest.mark.skipif(not landlock_abi(), reason="this kernel has no Landlock")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _run(tmp_path: Path, snippet: str) -> dict[str, str]:
    """Run :data:`PRELUDE` and ``snippet`` in a fresh interpreter, in ``tmp_path``; its ``<what> <outcome>`` lines."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "TMPDIR": str(tmp_path)}
    code = PRELUDE + textwrap.dedent(snippet)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


@needs_seccomp
def test_a_confined_worker_starts_no_process(tmp_path: Path) -> None:
    """No fork (its child would escape the memory budget and, in a session of its own, outlive the run), no program
    started however Python starts one, and no exec (the last, as on the old code it replaces the snippet)."""
    seen = _run(
        tmp_path,
        """
        confine(writable=[HERE])

        def fork():
            if os.fork() == 0:
                os._exit(0)

        outcome("fork", fork)
        outcome("subprocess", lambda: subprocess.run(["true"]))
        outcome("posix_spawn", lambda: os.posix_spawn("/bin/true", ["true"], {}))
        outcome("exec", lambda: os.execv("/bin/true", ["true"]))
        """,
    )
    assert seen == {"fork": "PermissionError", "subprocess": "PermissionError", "posix_spawn": "PermissionError", "exec": "PermissionError"}


@needs_seccomp
def test_a_confined_worker_opens_no_socket_but_keeps_its_channel(tmp_path: Path) -> None:
    """No UDP to another worker on 127.0.0.1, no unix datagram socket (even bound where it may write), no socket pair, no
    memfd (memory no budget counts); the channel it was given before (its descriptor 3 in a worker) still carries
    messages."""
    seen = _run(
        tmp_path,
        """
        ours, theirs = socket.socketpair()
        confine(writable=[HERE])

        def udp():
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))

        def unix_datagram():
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).bind(str(HERE / "dgram.sock"))

        def channel():
            theirs.sendall(b"ping")
            assert ours.recv(4) == b"ping"

        outcome("udp", udp)
        outcome("unix_datagram", unix_datagram)
        outcome("socketpair", socket.socketpair)
        outcome("memfd", lambda: os.memfd_create("held"))
        outcome("channel", channel)
        """,
    )
    refused = {"udp", "unix_datagram", "socketpair", "memfd"}
    assert seen == {**{what: "PermissionError" for what in refused}, "channel": "done"}


@needs_landlock
@pytest.mark.parametrize("devices", [False, True], ids=["cpu", "gpu"])
def test_a_confined_worker_writes_nothing_in_dev_shm(tmp_path: Path, devices: bool) -> None:
    """``/dev/shm`` is machine-wide memory that no budget counts: no worker writes it, on a GPU (which may write the
    rest of ``/dev``) either; its own folder and ``/dev/null`` it writes."""
    seen = _run(
        tmp_path,
        f"""
        confine(writable=[HERE], devices={devices})

        def shm():
            path = Path("/dev/shm") / f"fdattack-test-{{os.getpid()}}"
            path.write_text("x")
            path.unlink()

        outcome("shm", shm)
        outcome("own", lambda: (HERE / "own.txt").write_text("x"))
        outcome("null", lambda: Path("/dev/null").write_text("x"))
        """,
    )
    assert seen == {"shm": "PermissionError", "own": "done", "null": "done"}


@needs_seccomp
def test_a_confined_worker_still_runs_threads_and_torch(tmp_path: Path) -> None:
    """Under its filter (``Seccomp: 2``), a worker's Python threads start and torch's pool of two threads computes a
    matrix product right (glibc's threads come through ``clone`` once ``clone3`` says ENOSYS)."""
    seen = _run(
        tmp_path,
        """
        confine(writable=[HERE])
        print("filter", [line.split()[1] for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("Seccomp:")][0])
        ran = []
        thread = threading.Thread(target=ran.append, args=(1,))
        thread.start()
        thread.join()
        print("thread", ran == [1])
        torch.set_num_threads(2)
        a, b = torch.randn(512, 512, dtype=torch.float64), torch.randn(512, 512, dtype=torch.float64)
        expected = sum(a[:, k : k + 1] * b[k : k + 1, :] for k in range(512))
        print("matmul", torch.allclose(a @ b, expected) and torch.ones(1 << 22).add(1).sum().item() == 2 << 22)
        print("threads", len(os.listdir("/proc/self/task")) > 1)
        """,
    )
    assert seen == {"filter": "2", "thread": "True", "matmul": "True", "threads": "True"}


def test_confine_refuses_a_process_of_several_threads(tmp_path: Path) -> None:
    """Landlock and seccomp confine the calling thread and those it starts afterwards: a thread already running would
    stay free, so :func:`confine` refuses to confine part of a process."""
    seen = _run(
        tmp_path,
        """
        running = threading.Event()
        threading.Thread(target=running.wait, daemon=True).start()
        try:
            confine(writable=[HERE])
        except RuntimeError as error:
            print("confine", "several threads" if "threads" in str(error) else str(error))
        else:
            print("confine", "done")
        running.set()
        """,
    )
    assert seen == {"confine": "several threads"}


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="this kernel has no /proc/<pid>/smaps_rollup")
def test_a_worker_s_memory_is_what_it_holds_alone(tmp_path: Path) -> None:
    """A child forked from a parent that holds 300 MiB (as a worker is from the zygote, which holds torch) counts the
    64 MiB it maps and writes itself, shared mapping included, and not the 300 MiB, which its VmRSS counts."""
    seen = _run(
        tmp_path,
        """
        import mmap
        from fdattack.isolation.budgets import resident_mb

        held = bytearray(b"\\x01") * (300 << 20)  # every page touched
        ready, go = os.pipe(), os.pipe()
        pid = os.fork()
        if pid == 0:
            own = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_SHARED)
            for at in range(0, 64 << 20, 4096):
                own[at] = 2
            os.write(ready[1], b"r")
            os.read(go[0], 1)
            os._exit(0)
        os.read(ready[0], 1)
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        print("vmrss", int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) >> 10)
        print("counted", int(resident_mb(pid)))
        os.write(go[1], b"g")
        os.waitpid(pid, 0)
        """,
    )
    assert int(seen["vmrss"]) > 364 and 64 <= int(seen["counted"]) < 150, seen
