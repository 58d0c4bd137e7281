"""A run killed with SIGKILL after round 2 of 4 and resumed ends exactly like an uninterrupted run; so does one resumed
from an older checkpoint, attacks included."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fdattack.cli import main
from tests.conftest import REPO, error_of

ARGS = [
    "protocol.num_clients=3",
    "protocol.rounds=4",
    "protocol.transfer_public_epochs=1",
    "protocol.transfer_private_epochs=1",
    "protocol.digest_epochs=3",
    "protocol.revisit_epochs=3",
    "logger.wandb.mode=disabled",
    "logger.progress=never",
    # small attacks, so that their per-client networks on disk, learned prior and evaluation classifier resume too
    "attacks=[pli,tbi]",
    "attack.pli.max_width=16",
    "attack.tbi.max_width=16",
    "attack.pli.epochs_per_round=1",
    "attack.tbi.epochs_per_round=1",
    "attack.pli.prior.epochs=1",
    "attack.pli.prior.width=8",
    "evaluation.epochs=2",
]


def _launch(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fdattack", "run", *ARGS, f"output_dir={out}", *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _without_times(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("time/")}


@pytest.mark.slow
def test_sigkill_after_round_2_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    ref_proc = _launch(reference)
    proc = _launch(killed)
    checkpoint = killed / "checkpoints" / "round_0002.pt"
    deadline = time.monotonic() + 900
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "metrics.json").exists()
    assert ref_proc.wait(timeout=900) == 0, ref_proc.stderr.read()  # type: ignore[union-attr]

    resumed = subprocess.run(
        [sys.executable, "-m", "fdattack", "run", *ARGS, f"output_dir={killed}", "resume=true"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr
    ref_metrics = json.loads((reference / "metrics.json").read_text())
    res_metrics = json.loads((killed / "metrics.json").read_text())
    assert _without_times(res_metrics) == _without_times(ref_metrics)
    ref_rows = [_without_times(json.loads(x)) for x in (reference / "rounds.jsonl").read_text().splitlines()]
    res_rows = [_without_times(json.loads(x)) for x in (killed / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in res_rows] == [0, 1, 2, 3, 4]
    assert res_rows == ref_rows


def test_resume_without_checkpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "empty_run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["run", *ARGS, f"output_dir={out}", "resume=true"]) == 2
    assert "checkpoint" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"


def test_corrupt_checkpoint_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["run", *ARGS, "protocol.rounds=1", f"output_dir={out}"]) == 0
    ckpt = sorted((out / "checkpoints").glob("round_*.pt"))[-1]
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert main(["run", *ARGS, "protocol.rounds=1", f"output_dir={out}", "resume=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(ckpt) in error_of(err)


def test_resume_from_an_older_kept_checkpoint_with_attacks_matches(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "run",
        "protocol.num_clients=2",
        "protocol.rounds=3",
        "protocol.transfer_public_epochs=1",
        "protocol.transfer_private_epochs=1",
        "logger.wandb.mode=disabled",
        "logger.progress=never",
        "evaluation.confidence_gap.enabled=false",
        "evaluation.classifier=null",
        "attacks=[tbi]",
        "attack.tbi.max_width=16",
        "attack.tbi.epochs_per_round=1",
        "keep_checkpoints=2",
        f"output_dir={out}",
    ]
    assert main(args) == 0
    finished = json.loads((out / "metrics.json").read_text())
    rows = [_without_times(json.loads(x)) for x in (out / "rounds.jsonl").read_text().splitlines()]
    (out / "checkpoints" / "round_0003.pt").unlink()  # "delete the corrupt checkpoint to resume from an earlier one"
    assert main([*args, "resume=true"]) == 0
    assert _without_times(json.loads((out / "metrics.json").read_text())) == _without_times(finished)
    assert [_without_times(json.loads(x)) for x in (out / "rounds.jsonl").read_text().splitlines()] == rows


def test_a_checkpoint_of_another_seed_is_refused_not_continued(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30: a checkpoint from the same experiment at another seed, copied into a run directory, resumed without a
    word into a hybrid of the two runs. The checkpoint carries its config's fingerprint; a resume refuses another's."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    assert main(["run", *ARGS, "protocol.rounds=1", "seed=1", f"output_dir={mine}"]) == 0
    assert main(["run", *ARGS, "protocol.rounds=1", "seed=2", f"output_dir={theirs}"]) == 0
    ckpt = sorted((mine / "checkpoints").glob("round_*.pt"))[-1]
    shutil.copyfile(sorted((theirs / "checkpoints").glob("round_*.pt"))[-1], ckpt)
    capsys.readouterr()
    assert main(["run", *ARGS, "protocol.rounds=1", "seed=1", f"output_dir={mine}", "resume=true"]) == 2
    err = error_of(capsys.readouterr().err)
    assert str(ckpt) in err and "another config" in err
