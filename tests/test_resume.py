"""A run killed with SIGKILL after round 2 of 4 and resumed ends exactly like an uninterrupted run; so does one resumed
from an older checkpoint, attacks included."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fdattack.cli import main
from fdattack.tracking.run_dir import config_fingerprint
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
    "data.max_per_class=30",  # 30 images a digit: a round in about a second, still many steps of every network
]


#: A one-round run built in seconds: 2 clients, a small attack, no evaluation classifier.
QUICK = [
    "protocol.num_clients=2",
    "protocol.rounds=1",
    "protocol.transfer_public_epochs=1",
    "protocol.transfer_private_epochs=1",
    "logger.wandb.mode=disabled",
    "logger.progress=never",
    "evaluation.confidence_gap.enabled=false",
    "evaluation.classifier=null",
    "attacks=[tbi]",
    "attack.tbi.max_width=16",
    "attack.tbi.epochs_per_round=1",
    "data.max_per_class=30",
]


def _launch(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fdattack", "run", *ARGS, f"output_dir={out}", *extra],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_once_written(proc: subprocess.Popen, checkpoint: Path) -> None:
    """SIGKILL ``proc`` as soon as ``checkpoint`` exists (or at once if it ended or took too long), and reap it."""
    deadline = time.monotonic() + 900
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()  # SIGKILL; nothing if it has already ended
    proc.wait()


def _without_times(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("time/")}


@pytest.mark.slow
def test_sigkill_after_round_2_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    """Only the killed run is a real process (SIGKILL needs one); the uninterrupted reference and the resume run in this
    process, the reference while the killed run is under way. The killed run's rounds 0-2 (its rounds.jsonl, its
    checkpoint) come from the other process, so the rows compared are still written by two processes."""
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    proc = _launch(killed)
    killer = threading.Thread(target=_kill_once_written, args=(proc, killed / "checkpoints" / "round_0002.pt"))
    killer.start()
    try:
        assert main(["run", *ARGS, f"output_dir={reference}"]) == 0
    finally:
        killer.join()
    assert proc.returncode == -signal.SIGKILL, f"the run finished before it could be killed: {proc.stderr.read()}"  # type: ignore[union-attr]
    assert not (killed / "metrics.json").exists()

    assert main(["run", *ARGS, f"output_dir={killed}", "resume=true"]) == 0
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
    args = ["run", *QUICK, "protocol.rounds=3", "keep_checkpoints=2", f"output_dir={out}"]
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


def _payload(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def _save(path: Path, payload: dict) -> None:
    import torch

    torch.save(payload, path)


def _without(payload: dict, *keys: str) -> dict:
    return {k: v for k, v in payload.items() if k not in keys}


def _tamper_config_gone(run: Path, other: Path) -> None:
    (run / "config.yaml").unlink()


def _tamper_rounds_gone(run: Path, other: Path) -> None:
    (run / "rounds.jsonl").unlink()


def _tamper_round_line_torn(run: Path, other: Path) -> None:
    lines = (run / "rounds.jsonl").read_text().splitlines()
    (run / "rounds.jsonl").write_text("\n".join([lines[0], lines[1][: len(lines[1]) // 2]]) + "\n")


def _tamper_empty_payload(run: Path, other: Path) -> None:
    _save(run / "checkpoints" / "round_0001.pt", {})


def _tamper_no_rng(run: Path, other: Path) -> None:
    path = run / "checkpoints" / "round_0001.pt"
    _save(path, _without(_payload(path), "rng"))


def _tamper_renamed_round(run: Path, other: Path) -> None:
    path = run / "checkpoints" / "round_0001.pt"
    _save(path, {**_payload(path), "round": 7})


def _tamper_other_run(run: Path, other: Path) -> None:
    shutil.copyfile(other / "checkpoints" / "round_0001.pt", run / "checkpoints" / "round_0001.pt")


def _tamper_other_run_before_fingerprints(run: Path, other: Path) -> None:
    """Another run's checkpoint as written before issue 30 (no fingerprint): its networks do not fit this run's."""
    _save(run / "checkpoints" / "round_0001.pt", _without(_payload(other / "checkpoints" / "round_0001.pt"), "config_fingerprint"))


#: (tamper, the other run's overrides, overrides of the resume, text the one error line names)
REFUSED_RESUMES = {
    "config.yaml missing, a key changed": (_tamper_config_gone, [], ["protocol.revisit_epochs=5"], "another config"),
    "rounds.jsonl missing": (_tamper_rounds_gone, [], [], "rounds.jsonl: misses round(s) 0, 1"),
    "rounds.jsonl round 1 torn": (_tamper_round_line_torn, [], [], "rounds.jsonl: misses round(s) 1"),
    "checkpoint holding {}": (_tamper_empty_payload, [], [], "not an fdattack run checkpoint (it has no round, protocol"),
    "checkpoint without its rng": (_tamper_no_rng, [], [], "(it has no rng)"),
    "checkpoint of another round": (_tamper_renamed_round, [], [], "holds round 7, not round 1"),
    "another protocol's checkpoint": (_tamper_other_run, ["protocol=fedgems"], [], "another config"),
    "another client count's checkpoint": (_tamper_other_run, ["protocol.num_clients=3"], [], "another config"),
    "another client count's, before fingerprints": (
        _tamper_other_run_before_fingerprints,
        ["protocol.num_clients=3"],
        [],
        "does not fit this run",
    ),
}


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The one-round run that each case tampers with, and the other runs whose checkpoints are planted in it."""
    root = tmp_path_factory.mktemp("finished")
    runs = {}
    for extra in [(), *sorted({tuple(case[1]) for case in REFUSED_RESUMES.values()} - {()})]:
        runs[" ".join(extra)] = root / f"run{len(runs)}"
        other_protocol = any(token.startswith("protocol=") for token in extra)  # FedMD's epoch keys are its own
        args = [a for a in QUICK if not (other_protocol and a.startswith("protocol.transfer_"))]
        assert main(["run", *args, *extra, f"output_dir={runs[' '.join(extra)]}"]) == 0
    return runs


@pytest.mark.parametrize("case", list(REFUSED_RESUMES))
def test_a_run_directory_that_is_not_what_it_claims_is_refused_and_kept(
    case: str, finished_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30: a resume from a directory whose checkpoint, config.yaml or rounds.jsonl is not this run's continued into
    a hybrid run, lost metrics, or failed with a traceback. Each is refused in one line; the directory (exit.json
    included) is left as it was."""
    tamper, other, resume_extra, named = REFUSED_RESUMES[case]
    run = tmp_path / "run"
    shutil.copytree(finished_runs[""], run)
    tamper(run, finished_runs[" ".join(other)])
    (run / "exit.json").write_text('{"signal": "SIGTERM"}\n')
    before = {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".fdattack.lock"}
    capsys.readouterr()
    assert main(["run", *QUICK, f"output_dir={run}", "resume=true", *resume_extra]) == 2
    assert named in error_of(capsys.readouterr().err)
    after = {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".fdattack.lock"}
    assert after == before


def test_a_missing_config_yaml_is_written_again_when_the_checkpoint_vouches_for_the_config(
    finished_runs: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 30: with config.yaml missing, a resume never wrote it again. The checkpoint's fingerprint shows the command
    is the run's config: the resume goes on and config.yaml is back, as the first run wrote it."""
    run = tmp_path / "run"
    shutil.copytree(finished_runs[""], run)
    stored = (run / "config.yaml").read_text()
    (run / "config.yaml").unlink()
    assert main(["run", *QUICK, f"output_dir={run}", "resume=true"]) == 0
    assert config_fingerprint(OmegaConf.load(run / "config.yaml")) == config_fingerprint(OmegaConf.create(stored))
