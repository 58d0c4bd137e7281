"""The workers' zygote: ``python -m fdattack.isolation.zygote <fd>``, started once per run, forks each attack's worker.

A worker's start is mostly imports (torch, Lightning, the attacks: seconds of CPU and hundreds of MiB each). The
zygote pays them once: started as a worker would be (a fresh interpreter, a clean environment, no descriptor of the
run's but its control socket, holding nothing of the run), it imports what every worker needs, runs nothing of it,
and then, for each worker the run asks for, forks a child that takes the channel and the log file the run sends it
(over the control socket, ``SCM_RIGHTS``), starts a session of its own, keeps no other descriptor, moves into its state
folder and runs :func:`fdattack.isolation.worker.main`. The children share the zygote's imported pages until they
write them. The zygote dies with the run, and each worker with the zygote (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
from typing import NoReturn

CHANNEL_FD = 3  # where a worker finds its channel
_MAX_FDS = 2


def preload() -> None:
    """Import what every worker imports (nothing of it runs: no thread pool starts before the fork)."""
    import fdattack.attacks  # noqa: F401 - the registry and every built-in attack
    import fdattack.engine  # noqa: F401 - Lightning Fabric
    import fdattack.isolation.worker  # noqa: F401


def become_worker(channel: int, log: int, folder: str, tmpdir: str) -> NoReturn:
    """In a forked child: descriptors 0-2 and :data:`CHANNEL_FD` only, a session and folder of its own, then the worker."""
    from fdattack.isolation import worker

    os.setsid()
    os.chdir(folder)
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (log, 1), (log, 2), (channel, CHANNEL_FD)):
        os.dup2(source, target)
    os.closerange(CHANNEL_FD + 1, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024)
    os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = None
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.argv = ["fdattack-worker"]
    code = 1
    try:
        worker.main([str(CHANNEL_FD)])
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    finally:
        os._exit(code)


def serve(control: socket.socket) -> None:
    """Fork a worker for each request (``{"folder", "tmpdir"}`` with the channel's and the log's descriptors); answer its pid."""
    while True:
        message, fds, _, _ = socket.recv_fds(control, 65536, _MAX_FDS)
        if not message:
            return  # the run closed the control socket
        request = json.loads(message)
        channel, log = fds
        pid = os.fork()
        if pid == 0:
            control.close()
            become_worker(channel, log, request["folder"], request["tmpdir"])
        os.close(channel)
        os.close(log)
        control.sendall(json.dumps({"pid": pid}).encode())


def main(argv: list[str]) -> NoReturn:
    from fdattack.engine.malloc import keep_freed_memory
    from fdattack.lifetime import die_with_parent

    die_with_parent()
    keep_freed_memory()  # as the fdattack command does for the run: the workers inherit it
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    control = socket.socket(fileno=int(argv[0]))
    preload()
    control.sendall(b'{"ready": true}')
    serve(control)
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
