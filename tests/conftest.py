"""Shared fixtures: small real configs, data paths, and an environment where W&B can never go online."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: one thread is faster than two on a 2-core box

import pytest
from filelock import FileLock, Timeout

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credentials, no network for W&B, and nothing written outside tmp_path."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))  # where W&B stages artifacts before an upload
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))


@pytest.fixture(autouse=True)
def _fdattack_records_reach_caplog(request: pytest.FixtureRequest) -> Iterator[None]:
    """fdattack's logger stops its records at its own handler (``fdattack.tracking.logs``); a test that asks for caplog
    gets them through caplog's handler on that logger too."""
    if "caplog" not in request.fixturenames:
        yield
        return
    handler = request.getfixturevalue("caplog").handler
    logger = logging.getLogger("fdattack")
    propagate = logger.propagate
    logger.propagate = False  # each record reaches caplog once, whether or not an earlier test on this worker configured logging
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)
    logger.propagate = propagate


def own_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """caplog's records from fdattack's own loggers only.

    caplog's handler sits on the root logger, so it also collects whatever a dependency logs (wandb's
    "Current SDK version is ...", "Configure stats pid ..." depend on the wandb version and machine);
    a test that counts or lists log lines must read these, never ``caplog.records`` / ``caplog.messages``.
    """
    return [r for r in caplog.records if r.name == "fdattack" or r.name.startswith("fdattack.")]


def own_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The messages of :func:`own_records`."""
    return [r.getMessage() for r in own_records(caplog)]


def error_of(stderr: str) -> str:
    """The one error line of a failed command's stderr, asserted: exactly one line starts with ``fdattack: error:`` and
    it is the last, with no traceback; fdattack's progress lines (INFO, shown when there is no terminal) may come first."""
    lines = stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("fdattack: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in stderr, stderr
    return errors[0]


def tiny(tmp_path: Path, *extra: str) -> list[str]:
    """Overrides that shrink any experiment to seconds: 2 clients, 2 rounds, few epochs, W&B off."""
    return [
        f"output_dir={tmp_path / 'run'}",
        "logger.wandb.mode=disabled",
        "logger.progress=never",
        "protocol.num_clients=2",
        "protocol.rounds=2",
        "attacks=[]",
        *extra,
    ]


def shared_runs(
    tmp_path_factory: pytest.TempPathFactory, name: str, runs: Mapping[str, Callable[[Path], dict[str, float]]]
) -> dict[str, dict[str, float]]:
    """Each run of ``runs`` (a key and a function of an output folder returning the run's metrics) once per test session,
    even where pytest-xdist hands the tests that share them to two workers: the metrics are kept as JSON in the session's
    base temp folder (which the workers share), each behind a file lock. A worker first takes the runs no one holds,
    then waits for the others' results, so two workers split the runs instead of doing them twice."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    folder = root / "shared_runs" / name
    folder.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    for wait in (False, True):
        for key in [k for k in runs if k not in results]:
            lock = FileLock(str(folder / f"{key}.lock"))
            try:
                lock.acquire(timeout=-1 if wait else 0)
            except Timeout:
                continue
            try:
                done = folder / f"{key}.json"
                if not done.exists():
                    partial = folder / f"{key}.json.partial"
                    partial.write_text(json.dumps(runs[key](folder / key)))
                    partial.rename(done)
                results[key] = json.loads(done.read_text())
            finally:
                lock.release()
    return {k: results[k] for k in runs}
