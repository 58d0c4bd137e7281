"""W&B: credentials by W&B's own lookup, a bounded online start, one step per round, the exit record and the sync hint.

Network: only the loopback address http://127.0.0.1:9 (nothing listens there), so every online start fails fast.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from fdattack.cli import main
from fdattack.config import WandbConfig
from fdattack.errors import ConfigError
from fdattack.tracking import WandbRun, has_credentials
from fdattack.tracking.wandb_run import run_identity, server_url
from tests.conftest import REPO, error_of, own_messages, tiny

KEY = "k" * 40
UNREACHABLE = "http://127.0.0.1:9"  # loopback, discard port: connection refused at once
TIMEOUT_S = 2.0
# below W&B's own unbounded 90 s: the bounded start plus W&B's service start-up and teardown on a loaded 2-core machine
# (W&B's own default: 90 s + retries)
BOUND_S = 60.0


def wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` transaction log (a LevelDB-style log of ``wandb_internal_pb2.Record``, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def finished_records(run_dir: Path) -> list:
    """The records of the one W&B run under ``run_dir``, once wandb-core has written its exit record (polled: a read that
    catches a record half-written is read again)."""
    files = list(run_dir.glob("wandb/*-run-*/*.wandb"))
    assert len(files) == 1, files
    from google.protobuf.message import DecodeError

    deadline = time.perf_counter() + 60.0
    while True:
        try:
            records = wandb_records(files[0])
        except DecodeError:  # a record wandb-core is still writing: read again
            if time.perf_counter() > deadline:
                raise
            time.sleep(0.1)
            continue
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.perf_counter() > deadline:
            return records


def history(records: list) -> list[tuple[int, set[str]]]:
    """(W&B step, top-level keys) of each history row."""
    return [
        (r.history.step.num, {item.key or item.nested_key[0] for item in r.history.item})
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def fresh_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """W&B reads its settings once per process: make it read this test's environment, and forget it afterwards."""
    import wandb

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    wandb.teardown()
    yield
    wandb.teardown()


# ------------------------------------------------------------------------------------------- credentials
def test_key_saved_by_this_wandb_versions_login_is_seen(tmp_path: Path, fresh_wandb: None) -> None:
    """wandb 0.31 logs in to api.forge.coreweave.com by default: its netrc entry is under that host, not api.wandb.ai."""
    from wandb.sdk.lib import urls, wbauth

    assert not has_credentials()
    wbauth.write_netrc_auth(host=urls.DEFAULT_BASE_URL, api_key=KEY)  # what `wandb login KEY` writes, without verifying online
    assert "api.wandb.ai" not in Path(os.environ["NETRC"]).read_text()
    assert has_credentials()


def test_netrc_entry_for_a_custom_wandb_base_url_is_seen(tmp_path: Path, fresh_wandb: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", UNREACHABLE)
    Path(os.environ["NETRC"]).write_text(f"machine 127.0.0.1:9\n  login user\n  password {KEY}\n")  # wandb keys it by host:port
    assert has_credentials() and server_url() == UNREACHABLE


def test_wandb_login_with_host_is_seen(tmp_path: Path, fresh_wandb: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`wandb login --host URL` saves the key under host:port in ~/.netrc and the URL in W&B's settings file."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "WANDB_CONFIG_DIR": os.environ["WANDB_CONFIG_DIR"],
        "WANDB_SILENT": "true",
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),  # an install made with pip --target
    }
    subprocess.run(
        [sys.executable, "-m", "wandb", "login", "--no-verify", "--host", UNREACHABLE, KEY],
        env=env,
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    assert (tmp_path / "home" / ".netrc").is_file() and (Path(os.environ["WANDB_CONFIG_DIR"]) / "settings").is_file()
    monkeypatch.delenv("NETRC")
    assert has_credentials() and server_url() == UNREACHABLE


def test_malformed_key_is_one_line_in_online_and_offline_in_auto(
    fresh_wandb: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from fdattack.tracking import resolve_mode

    monkeypatch.setenv("WANDB_API_KEY", "short")
    with pytest.raises(ConfigError, match=r"W&B credentials are unusable: WANDB_API_KEY invalid.*40\+ characters") as info:
        resolve_mode("online")
    assert "\n" not in str(info.value)
    with caplog.at_level(logging.WARNING, logger="fdattack"):
        assert resolve_mode("auto") == "offline"
    assert own_messages(caplog) == [f"{info.value}; logging offline"]


# -------------------------------------------------------------------------------------- no network
def test_online_without_network_fails_in_one_line_and_leaves_no_files(
    tmp_path: Path, fresh_wandb: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("WANDB_BASE_URL", UNREACHABLE)
    out = tmp_path / "run"
    (out / "wandb").mkdir(parents=True)
    (out / "config.yaml").write_text("a: 1\n")
    before = _snapshot(out)
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"logger.wandb.mode=online: W&B did not start online at {UNREACHABLE} within 2 s") as info:
        WandbRun.start(WandbConfig(mode="online", init_timeout_s=TIMEOUT_S), out, {})
    assert time.perf_counter() - started < BOUND_S
    assert "\n" not in str(info.value) and "logger.wandb.mode=offline" in str(info.value)
    assert _snapshot(out) == before and sorted(p.name for p in (out / "wandb").iterdir()) == []


def test_auto_without_network_goes_offline_within_the_timeout_in_one_line(
    tmp_path: Path, fresh_wandb: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("WANDB_BASE_URL", UNREACHABLE)
    started = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="fdattack"):
        with WandbRun.start(WandbConfig(mode="auto", init_timeout_s=TIMEOUT_S), tmp_path / "run", {}) as run:
            assert run.mode == "offline"
    assert time.perf_counter() - started < BOUND_S
    assert [p.name for p in (tmp_path / "run" / "wandb").glob("*run-*")] == [run.directory.name]  # the failed start is gone
    lines = own_messages(caplog)  # fdattack's records only: wandb logs its own, which vary by version and machine
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"W&B did not start online at {UNREACHABLE} within 2 s") and lines[0].endswith(
        f"logging offline to {run.directory}"
    )
    assert lines[1] == f"W&B offline run in {run.directory}; upload it with: wandb sync {run.directory}"


def test_cli_online_without_network_is_exit_2_with_one_line(
    tmp_path: Path, fresh_wandb: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("WANDB_BASE_URL", UNREACHABLE)
    code = main(
        [
            "run",
            *tiny(
                tmp_path,
                "logger.wandb.mode=online",
                f"logger.wandb.init_timeout_s={TIMEOUT_S}",
                "protocol.rounds=1",
                "evaluation.confidence_gap.enabled=false",
            ),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and error_of(err).startswith("fdattack: error: logger.wandb.mode=online: W&B did not start online")


# ---------------------------------------------------------------------------------- one step per round
def test_each_round_is_one_wandb_step_and_a_resumed_run_continues_the_steps(tmp_path: Path) -> None:
    out, cfg = tmp_path / "run", WandbConfig(mode="offline")
    with WandbRun.start(cfg, out, {}) as first:
        for r in range(3):
            first.log_round(r, {"protocol/server_acc": r / 10}, {"diag/entropy": torch.rand(20)}, {"attack/pli/grid": torch.rand(3, 8, 8)})
    rows = history(finished_records(out))
    assert [step for step, _ in rows] == [0, 1, 2]
    assert all({"round", "protocol/server_acc", "diag/entropy", "attack/pli/grid"} <= keys for _, keys in rows)

    with WandbRun.start(cfg, out, {}, resume_id=first.run_id) as second:
        for r in (3, 4):
            second.log_round(r, {"protocol/server_acc": r / 10})
    resumed = [p for p in (out / "wandb").glob("offline-run-*") if p != first.directory]
    assert len(resumed) == 1
    deadline = time.perf_counter() + 60.0
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(next(resumed[0].glob("*.wandb")))):
        assert time.perf_counter() < deadline
        time.sleep(0.05)
    assert [step for step, _ in history(wandb_records(next(resumed[0].glob("*.wandb"))))] == [3, 4]


def test_offline_run_steps_are_rounds_with_group_job_type_tags_and_a_sync_hint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="fdattack"):
        assert main(["run", *tiny(tmp_path, "logger.wandb.mode=offline")]) == 0
    directory = next((out / "wandb").glob("offline-run-*"))
    assert f"W&B offline run in {directory}; upload it with: wandb sync {directory}" in own_messages(caplog)
    records = finished_records(out)
    rounds = [json.loads(line)["round"] for line in (out / "rounds.jsonl").read_text().splitlines()]
    rows = history(records)
    assert [step for step, _ in rows] == rounds == [0, 1, 2]
    assert any("diag/confidence_gap/client_public_entropy" in keys for _, keys in rows[1:])  # a histogram shares its round's step
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    name = OmegaConf.load(out / "config.yaml").name
    assert (run.display_name, run.run_group, run.job_type, list(run.tags)) == (name, name, "run", ["fedmd", "digits"])


@pytest.mark.parametrize("artifacts", ["all", "none"])
def test_an_offline_run_holds_its_console_its_system_metrics_and_its_directory_as_artifacts(tmp_path: Path, artifacts: str) -> None:
    """Issue 58: offline runs had the console log and system metrics off, and nothing of the run directory reached W&B.
    A synced offline run now holds its console (``output.log``), a system-metrics sample, and the run directory's
    results and last checkpoint as artifacts (``logger.wandb.artifacts=none`` opts out)."""
    out = tmp_path / "run"
    overrides = [
        "logger.wandb.mode=offline",
        "protocol.rounds=1",
        "evaluation.confidence_gap.enabled=false",
        f"logger.wandb.artifacts={artifacts}",
    ]
    assert main(["run", *tiny(tmp_path, *overrides, "attacks=[public_mean]", "evaluation.epochs=1")]) == 0
    records = finished_records(out)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "output_raw" in kinds and "stats" in kinds
    assert (next((out / "wandb").glob("offline-run-*")) / "files" / "output.log").is_file()
    logged = {r.artifact.type: (r.artifact.name, sorted(m.path for m in r.artifact.manifest.contents)) for r in records if r.artifact.name}
    if artifacts == "none":
        assert logged == {}
        return
    run_id = next(r.run.run_id for r in records if r.WhichOneof("record_type") == "run")
    files = ["config.yaml", "machine.json", "metrics.json", "partition.json", "rounds.jsonl"]
    files += [f"artifacts/{p.name}" for p in (out / "artifacts").glob("*_round_0001.pt")]  # the reconstructions, not the classifier
    files += [f"images/{p.name}" for p in (out / "images").iterdir()]
    assert any(name.startswith("artifacts/public_mean_") for name in files) and any(name.startswith("images/") for name in files)
    assert logged == {"fdattack-results": (f"results-{run_id}", sorted(files)), "model": (f"checkpoint-{run_id}", ["round_0001.pt"])}


def test_run_identity_defaults_and_overrides() -> None:
    config = {
        "name": "pli_fedmd_digits",
        "protocol": {"name": "fedmd"},
        "data": {"name": "digits"},
        "attacks": ["pli", "tbi"],
        "defenses": ["laplace"],
    }
    assert run_identity(WandbConfig(), config) == {
        "name": "pli_fedmd_digits",
        "group": "pli_fedmd_digits",
        "job_type": "run",
        "tags": ["fedmd", "digits", "pli", "tbi", "laplace"],
    }
    given = WandbConfig(name="mine", group="g", job_type="eval", tags=["baseline", "pli"])
    assert run_identity(given, config) == {
        "name": "mine",
        "group": "g",
        "job_type": "eval",
        "tags": ["fedmd", "digits", "pli", "tbi", "laplace", "baseline"],
    }


# -------------------------------------------------------------------------------------------- SIGTERM
def test_sigterm_mid_run_writes_an_exit_record_and_exits_143(tmp_path: Path) -> None:
    out = tmp_path / "run"
    tokens = [
        *tiny(
            tmp_path, "logger.wandb.mode=offline", "protocol.rounds=500", "checkpoint_every=1", "evaluation.confidence_gap.enabled=false"
        ),
        "protocol.transfer_public_epochs=1",  # round 1 sooner: the signal, not the training, is tested
        "protocol.transfer_private_epochs=1",
        "data.max_per_class=30",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen(
        [sys.executable, "-m", "fdattack", "run", *tokens],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.perf_counter() + 600.0
        while not ((out / "rounds.jsonl").is_file() and len((out / "rounds.jsonl").read_text().splitlines()) >= 2):
            assert child.poll() is None and time.perf_counter() < deadline, child.communicate()
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
    rounds = [json.loads(line)["round"] for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert child.returncode == 143, stderr
    assert rounds == list(range(len(rounds))) and rounds[-1] < 500
    record = json.loads((out / "exit.json").read_text())
    assert (record["signal"], record["exit_code"], record["last_round"]) == ("SIGTERM", 143, rounds[-1])
    assert f"fdattack: terminated by SIGTERM after round {rounds[-1]}" in stderr and "Traceback" not in stderr
    exits = [r.exit.exit_code for r in finished_records(out) if r.WhichOneof("record_type") == "exit"]
    assert exits == [143]
