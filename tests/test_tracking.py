"""Run directory, atomic checkpoints, RNG state and W&B (offline, auto, disabled)."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fdattack.config import WandbConfig
from fdattack.errors import CheckpointError, ConfigError
from fdattack.tracking import (
    CheckpointDir,
    RunDirectory,
    WandbRun,
    load_checkpoint,
    resolve_mode,
    rng_state,
    save_checkpoint,
    set_rng_state,
)

WANDB_BOUND_S = 60.0  # offline init + logging + finish never blocks: about 0.5 s on an idle 2-core machine, far more on a loaded one


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------- checkpoints
def test_atomic_save_keeps_old_checkpoint_when_replace_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    path = folder / "round_0001.pt"
    save_checkpoint(path, {"w": torch.ones(3)})

    def crash(src: str, dst: str) -> None:
        raise OSError("simulated crash after the temporary write")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(path, {"w": torch.zeros(3)})
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["w"], torch.ones(3))
    assert [p.name for p in folder.iterdir()] == ["round_0001.pt"]


def test_sigkill_during_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    writer = (
        "import io, time, torch\n"
        "from fdattack.tracking import CheckpointDir, atomic_write\n"
        f"ckpts = CheckpointDir({str(folder)!r}, keep=2)\n"
        "ckpts.save(1, {'round': 1, 'w': torch.ones(1000)})\n"
        "def half_then_hang(handle):\n"
        "    buffer = io.BytesIO()\n"
        "    torch.save({'round': 2, 'w': torch.zeros(1000)}, buffer)\n"
        "    handle.write(buffer.getvalue()[:2000])\n"
        "    handle.flush()\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
        "atomic_write(ckpts.path_for(1), half_then_hang)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", writer], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[1]
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"writing"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    ckpts = CheckpointDir(folder, keep=2)
    assert len(list(folder.glob(".round_0001.pt.*.tmp"))) == 1  # the killed write's leftover
    assert ckpts.latest() == (1, folder / "round_0001.pt")
    assert torch.equal(load_checkpoint(folder / "round_0001.pt")["w"], torch.ones(1000))
    ckpts.save(2, {"round": 2})
    assert sorted(p.name for p in folder.iterdir()) == ["round_0001.pt", "round_0002.pt"]


def test_truncated_checkpoint_raises_checkpoint_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "round_0002.pt"
    save_checkpoint(path, {"w": torch.randn(1000), "round": 2})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="round_0002.pt: corrupt or truncated checkpoint") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")


def test_weights_only_round_trip_with_rng_states(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    payload = {
        "rng": rng_state(),
        "model": {"w": torch.arange(4.0)},
        "hist": [1, 2.5, None, "x", True],
        "np_array": np.arange(3),
        "np_scalar": np.float32(0.5),
    }
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    save_checkpoint(tmp_path / "c.pt", payload)
    loaded = torch.load(tmp_path / "c.pt", map_location="cpu", weights_only=True)
    assert loaded["hist"] == [1, 2.5, None, "x", True]
    assert torch.equal(loaded["np_array"], torch.arange(3)) and loaded["np_scalar"] == 0.5
    random.random(), np.random.rand(), torch.rand(1)
    set_rng_state(loaded["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_unsupported_payload_is_refused_before_writing(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    with pytest.raises(TypeError, match=r"payload\.bad"):
        save_checkpoint(folder / "c.pt", {"bad": object()})
    assert list(folder.iterdir()) == []


def test_checkpoint_dir_keeps_the_newest_and_ignores_temp_files(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path / "checkpoints", keep=2)
    assert ckpts.latest() is None
    for r in range(1, 5):
        ckpts.save(r, {"round": r})
    (ckpts.folder / ".round_0009.pt.abc.tmp").write_bytes(b"half")
    assert sorted(p.name for p in ckpts.folder.glob("round_*.pt")) == ["round_0003.pt", "round_0004.pt"]
    assert ckpts.latest() == (4, ckpts.folder / "round_0004.pt")
    assert load_checkpoint(ckpts.latest()[1])["round"] == 4  # type: ignore[index]
    ckpts.save(5, {"round": 5})
    assert sorted(p.name for p in ckpts.folder.iterdir()) == ["round_0004.pt", "round_0005.pt"]


# ----------------------------------------------------------------------------------------- run directory
def test_non_empty_dir_is_refused_without_resume_and_left_untouched(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "rounds.jsonl").write_text('{"round": 1}\n')
    (out / "checkpoints" / "round_0001.pt").write_bytes(b"\x00\x01")
    before = _snapshot(out)
    with pytest.raises(CheckpointError, match="is not empty; pass resume=true") as info:
        RunDirectory(out).prepare(resume=False)
    assert str(out) in str(info.value)
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == ["checkpoints", "rounds.jsonl"]


def test_resume_without_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        RunDirectory(tmp_path / "nothing").prepare(resume=True)
    assert not (tmp_path / "nothing").exists()


def test_prepare_creates_layout_and_non_writer_touches_nothing(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    run.prepare(resume=False)
    assert (tmp_path / "run" / "checkpoints").is_dir() and (tmp_path / "run" / "images").is_dir()
    assert run.image_path("pli_grid", 3) == tmp_path / "run" / "images" / "pli_grid_round_0003.png"

    other = RunDirectory(tmp_path / "rank1", is_writer=False)
    other.prepare(resume=False)
    other.write_config(OmegaConf.create({"a": 1}))
    other.append_round({"round": 1})
    other.truncate_rounds(0)
    other.write_metrics({"x": 1.0})
    other.checkpoints.save(1, {"round": 1})
    assert not (tmp_path / "rank1").exists()


def test_config_mismatch_on_resume_names_the_key(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = OmegaConf.create(
        {
            "name": "x",
            "resume": False,
            "output_dir": str(out),
            "lr": 0.001,
            "protocol": {"rounds": 5, "clients": [1, 2]},
            "nan": float("nan"),
        }
    )
    first = RunDirectory(out)
    first.prepare(resume=False)
    first.write_config(cfg)
    first.checkpoints.save(1, {"round": 1})
    stored = (out / "config.yaml").read_bytes()
    assert OmegaConf.load(out / "config.yaml").protocol.rounds == 5

    same = OmegaConf.merge(cfg, {"resume": True, "output_dir": "elsewhere"})
    resumed = RunDirectory(out)
    resumed.prepare(resume=True)
    resumed.write_config(same)
    assert (out / "config.yaml").read_bytes() == stored

    changed = OmegaConf.merge(same, {"protocol": {"rounds": 7}})
    again = RunDirectory(out)
    again.prepare(resume=True)
    with pytest.raises(CheckpointError, match=r"cannot resume: .*protocol\.rounds \(stored 5, given 7\)"):
        again.write_config(changed)
    with pytest.raises(CheckpointError, match=r"protocol\.clients\.1 \(stored 2, given 3\)"):
        again.write_config(OmegaConf.merge(same, {"protocol": {"clients": [1, 3]}}))
    assert (out / "config.yaml").read_bytes() == stored


def test_rounds_jsonl_append_and_truncate(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    run.prepare(resume=False)
    for r in range(4):
        run.append_round({"round": r, "attack/pli/accuracy": r / 10})
    with open(run.rounds_path, "a") as handle:
        handle.write('{"round": 4, "attack/pli/acc')  # a write cut short by a kill
    run.truncate_rounds(1)
    rows = [json.loads(line) for line in run.rounds_path.read_text().splitlines()]
    assert rows == [{"round": 0, "attack/pli/accuracy": 0.0}, {"round": 1, "attack/pli/accuracy": 0.1}]
    run.append_round({"round": 2, "attack/pli/accuracy": 0.2})
    assert [json.loads(line)["round"] for line in run.rounds_path.read_text().splitlines()] == [0, 1, 2]


def test_nan_becomes_null_and_tensors_become_numbers(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    run.prepare(resume=False)
    record = {
        "round": 1,
        "attack/pli/ssim": float("nan"),
        "protocol/server_acc": torch.tensor(0.5),
        "time/total_s": np.float32(2.0),
        "b/inf": float("inf"),
        "a/flag": True,
    }
    run.append_round(record)
    assert json.loads(run.rounds_path.read_text()) == {
        "round": 1,
        "attack/pli/ssim": None,
        "protocol/server_acc": 0.5,
        "time/total_s": 2.0,
        "b/inf": None,
        "a/flag": True,
    }
    assert "NaN" not in run.rounds_path.read_text()
    run.write_metrics({k: v for k, v in record.items() if k != "round"})
    text = run.metrics_path.read_text()
    assert list(json.loads(text)) == ["a/flag", "attack/pli/ssim", "b/inf", "protocol/server_acc", "time/total_s"]
    assert json.loads(text)["attack/pli/ssim"] is None and text.startswith('{\n  "a/flag"')


# ------------------------------------------------------------------------------------------------ W&B
@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No API key, an empty netrc, HOME in tmp_path, stdin closed: a prompt would fail the test."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    netrc = tmp_path / "empty_netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HOME", str(tmp_path))
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stdin", closed)


def test_wandb_offline_writes_run_files_without_prompting(tmp_path: Path, no_credentials: None) -> None:
    out = tmp_path / "run"
    started = time.perf_counter()
    with WandbRun.start(WandbConfig(mode="offline", tags=["t"]), out, {"protocol": {"rounds": 2}}) as run:
        assert run.mode == "offline" and run.run_id
        run.log_round(
            1,
            {"attack/pli/accuracy": 0.25, "protocol/server_acc": torch.tensor(0.5)},
            {"diag/entropy": torch.rand(50)},
            {"attack/pli/reconstruction": torch.rand(3, 8, 8), "attack/pli/gray": torch.rand(1, 8, 8)},
        )
        run.set_summary({"attack/pli/accuracy": 0.25, "attack/pli/ssim": float("nan")})
    elapsed = time.perf_counter() - started
    assert elapsed < WANDB_BOUND_S, f"W&B offline init+finish took {elapsed:.1f}s"
    folders = list((out / "wandb").glob("offline-run-*"))
    assert len(folders) == 1 and folders[0] == run.directory
    records = list(folders[0].glob("*.wandb"))
    assert len(records) == 1
    # wandb-core may still be appending the transaction log just after finish() returns
    deadline = time.perf_counter() + 60.0
    while b"attack/pli/accuracy" not in records[0].read_bytes() and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert b"attack/pli/accuracy" in records[0].read_bytes()


def test_wandb_resume_continues_the_same_run_id(tmp_path: Path, no_credentials: None) -> None:
    cfg = WandbConfig(mode="offline")
    with WandbRun.start(cfg, tmp_path / "run", {}) as first:
        first.log_round(1, {"x": 1.0})
    with WandbRun.start(cfg, tmp_path / "run", {}, resume_id=first.run_id) as second:
        second.log_round(2, {"x": 2.0})
    assert second.run_id == first.run_id
    assert second.directory is not None and f"-{first.run_id}" in second.directory.name


def test_wandb_auto_resolves_by_credentials(tmp_path: Path, no_credentials: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_mode("auto") == "offline"
    assert resolve_mode("disabled") == "disabled"
    with pytest.raises(ConfigError, match="logger.wandb.mode=online but no W&B credentials"):
        resolve_mode("online")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc_with_key"))
    (tmp_path / "netrc_with_key").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert resolve_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_mode("auto") == "offline"
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("NETRC", str(tmp_path / "empty_netrc"))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode("auto") == "online"


def test_wandb_auto_falls_back_to_offline_when_online_start_fails(
    tmp_path: Path, no_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    real_init = wandb.init

    def init(*args: object, mode: str, **kwargs: object) -> object:
        if mode == "online":
            raise wandb.errors.CommError("no network")
        return real_init(*args, mode=mode, **kwargs)

    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setattr(wandb, "init", init)
    with WandbRun.start(WandbConfig(mode="auto"), tmp_path / "run", {}) as run:
        assert run.mode == "offline"
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))


def test_wandb_disabled_writes_nothing(tmp_path: Path, no_credentials: None) -> None:
    out = tmp_path / "run"
    with WandbRun.start(WandbConfig(mode="disabled"), out, {"a": 1}, resume_id="abc") as run:
        run.log_round(1, {"x": 1.0}, {"h": torch.rand(5)}, {"img": torch.rand(3, 4, 4)})
        run.set_summary({"x": 1.0})
    assert run.run_id is None and not run.enabled
    assert not out.exists() and not (tmp_path / "wandb").exists()


def test_wandb_context_manager_finishes_on_error(tmp_path: Path, no_credentials: None) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with WandbRun.start(WandbConfig(mode="offline"), tmp_path / "run", {}) as run:
            raise RuntimeError("boom")
    assert not run.enabled and run.run_id


# ------------------------------------------------------------------------------------------------- machine
def test_machine_json_and_the_wandb_config_name_the_cpu_instruction_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The instruction set torch's CPU kernels dispatch to (``torch.backends.cpu.get_cpu_capability()``: AVX512, AVX2,
    ...) is recorded where the run ran, beside the CPU model: the same model name can run different kernels."""
    from fdattack.cli import main
    from tests.conftest import tiny
    from tests.test_wandb import finished_records

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # whatever this machine's is
    out = tmp_path / "run"
    args = tiny(tmp_path, "logger.wandb.mode=offline", "protocol.rounds=1", "evaluation.confidence_gap.enabled=false")
    assert main(["run", *args]) == 0
    (start,) = json.loads((out / "machine.json").read_text())
    assert start["cpu_capability"] == "AVX2" and start["cpu_model"]
    (run,) = [r.run for r in finished_records(out) if r.WhichOneof("record_type") == "run"]
    (machine,) = [json.loads(item.value_json) for item in run.config.update if item.key == "machine"]
    assert machine["cpu_capability"] == "AVX2" and machine["cpu_model"] == start["cpu_model"]
