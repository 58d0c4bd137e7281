"""The worker processes as processes: the run's handle on the workers' zygote (:class:`Zygote`), a worker's
environment and log, and the pid helpers that see a worker gone or kill it (a child of the zygote, by pid)."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Sequence

from fdattack.attacks.declaration import Declaration, DeclarationError
from fdattack.errors import ConfigError, WorkerError
from fdattack.isolation import codec
from fdattack.isolation.framing import MessageError, MessageReader, read_message
from fdattack.isolation.wire import DeclarationBrief

log = logging.getLogger(__name__)

START_S = 600  # the longest a worker may take to start (import, build its attack) before it is stopped

#: environment variables a worker keeps (where Python, its packages and its threads are); nothing of the run
WORKER_ENVIRONMENT = (
    "PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "SYSTEMROOT",
)


def worker_environment(tmpdir: Path, import_roots: Sequence[Path] = ()) -> dict[str, str]:
    """A worker's (and the zygote's) environment: :data:`WORKER_ENVIRONMENT` from the run's, its own ``TMPDIR``, and
    ``import_roots`` (where the run imports its plugins from) ahead on ``PYTHONPATH``."""
    environment = {**{key: os.environ[key] for key in WORKER_ENVIRONMENT if key in os.environ}, "TMPDIR": str(tmpdir)}
    if import_roots:
        environment["PYTHONPATH"] = os.pathsep.join([*map(str, import_roots), *filter(None, [environment.get("PYTHONPATH")])])
    return environment


def bounded_line(text: str, limit: int = 300) -> str:
    """``text`` as one line of at most ``limit`` printable characters: a line break or control character is escaped
    (``\\n``), so a worker's text can forge no line of the run's log, and the rest is cut with "…"."""
    line = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def log_of(folder: Path) -> Path:
    """A worker's log: ``<state_root>/<attack>.log``, beside its folder, where no worker may write."""
    return folder.parent / f"{folder.name}.log"


def open_log(path: Path) -> int:
    """``path`` opened for appending and never through a symbolic link (``O_NOFOLLOW``): a worker's log lies beside its
    folder, where no worker writes, so a link there was planted; it is refused, not followed.

    Raises:
        WorkerError: it cannot be opened (a link, a folder, no permission), in one line.
    """
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        why = "a symbolic link there is refused" if error.errno == errno.ELOOP else error.strerror
        raise WorkerError(f"cannot open the worker log {path}: {why}") from None


class Zygote:
    """The run's handle on the workers' zygote (:mod:`fdattack.isolation.zygote`): started at once, it imports what the
    workers need while the run builds; :meth:`fork` then starts each worker in a fraction of a second. It imports
    ``plugins`` from where the run does.

    Raises:
        WorkerError: it did not start within :data:`START_S` or exited (the last line of its log says why).
    """

    def __init__(self, plugins: Sequence[str] = ()) -> None:
        from fdattack.plugins import plugin_roots

        self.folder = Path(tempfile.mkdtemp(prefix="fdattack-zygote-"))
        kind = socket.SOCK_SEQPACKET if hasattr(socket, "SOCK_SEQPACKET") else socket.SOCK_STREAM
        ours, theirs = socket.socketpair(socket.AF_UNIX, kind)
        with open(self.folder / "zygote.log", "ab") as output:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "fdattack.isolation.zygote", str(theirs.fileno())],
                cwd=self.folder,
                env=worker_environment(self.folder, plugin_roots(plugins)),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
                start_new_session=True,  # a Ctrl-C reaches the run, which stops the zygote itself
            )
        theirs.close()
        self._control = ours
        self._ready = False

    def fork(self, folder: Path, log: Path) -> tuple[Connection, int]:
        """A new worker in ``folder`` writing to ``log`` (outside ``folder``): the run's end of its channel, and its pid."""
        output = open_log(log)
        try:
            self._wait_ready()
            ours, theirs = socket.socketpair()
            request = json.dumps({"folder": str(folder.resolve()), "tmpdir": str((folder / "tmp").resolve())}).encode()
            socket.send_fds(self._control, [request], [theirs.fileno(), output])
        finally:
            os.close(output)
        theirs.close()
        return Connection(ours.detach()), int(json.loads(self._reply())["pid"])

    def declare(self, plugins: Sequence[str], settings: dict[str, dict[str, Any]]) -> dict[str, Declaration]:
        """Each attack's declarations with its settings (``{attack: attack.<name> as a plain dict}``), read by a confined
        child that holds nothing of the run (:func:`~fdattack.isolation.worker.declare_attacks`): no attack code runs in
        the run for them.

        Raises:
            ConfigError: the child failed (a plugin that does not import, settings its ``Settings`` refuses, a
                declaration that is not plain) or sent what is not declarations, in one line.
        """
        conn, pid = self.fork(self.folder, self.folder / "declare.log")
        try:
            conn.send_bytes(pickle.dumps(DeclarationBrief(tuple(plugins), settings), protocol=pickle.HIGHEST_PROTOCOL))
            reply = codec.decode(read_message(MessageReader(conn.fileno(), 1 << 20), time.monotonic() + START_S))
            if type(reply) is list and len(reply) == 2 and reply[0] == "failed" and type(reply[1]) is str:
                raise ConfigError(f"the attacks' declarations could not be read: {bounded_line(reply[1])}")
            if type(reply) is not list or len(reply) != 2 or reply[0] != "declared" or type(reply[1]) is not dict:
                raise DeclarationError("a reply that is not declarations")
            if set(reply[1]) != set(settings):
                raise DeclarationError(f"declarations of {sorted(reply[1])} where the run asked for {sorted(settings)}")
            return {name: Declaration.from_names(names) for name, names in reply[1].items()}
        except (codec.CodecError, DeclarationError, MessageError, TimeoutError, EOFError, OSError) as err:
            raise ConfigError(f"the attacks' declarations could not be read: {bounded_line(str(err))}") from None
        finally:
            conn.close()
            kill(pid)

    def close(self) -> None:
        """Stop the zygote (its workers are stopped by the run first) and remove its folder."""
        self._control.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _wait_ready(self) -> None:
        if not self._ready:
            self._reply()
            self._ready = True

    def _reply(self) -> bytes:
        self._control.settimeout(START_S)
        try:
            reply = self._control.recv(65536)
        except OSError:
            reply = b""
        if not reply:
            log_tail = (self.folder / "zygote.log").read_text(errors="replace").strip().splitlines()[-1:] or ["(empty log)"]
            raise WorkerError(f"the attack workers' zygote did not start or answer ({log_tail[0]}); run with isolation.mode=in_process")
        return reply


def running(pid: int) -> bool:
    """Whether process ``pid`` (a worker, a child of the zygote) is still there."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill(pid: int) -> None:
    """Kill worker ``pid`` and wait (up to 10 s) for the zygote to reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    gone_within(pid, 10.0)


def gone_within(pid: int, seconds: float) -> bool:
    """Wait up to ``seconds`` for worker ``pid`` to be gone (the zygote reaps it); whether it is."""
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not running(pid)
