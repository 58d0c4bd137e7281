"""The matrix and the seeds never lose, mix or stale a result (issue 46): they refuse, with one line and nothing touched,
what would overwrite a result, mix two configs' results or take a stale one as done; the check behind every read-back is
tests/test_results_check.py. Each test here failed on the code before it (its docstring says how)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from fdattack.cli import main
from tests.conftest import error_of, tiny
from tests.test_matrix import QUICK, matrix_file, run_matrix

#: a replica in seconds: public_mean trains nothing
ONE_ROUND = ("protocol.rounds=1", "attacks=[public_mean]", "evaluation.classifier=null", "evaluation.confidence_gap.enabled=false")


def _fingerprint(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (but the lock) and its content's digest: what 'nothing touched' compares."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".fdattack.lock"
    }


def _one_cell(tmp_path: Path, **changes: object) -> Path:
    """A matrix of one cell at one seed (fedmd, no defense, LDIA and the public mean)."""
    return matrix_file(tmp_path, **{"protocols": {"fedmd": ["protocol=fedmd"]}, "defenses": {"none": []}, "seeds": [0], **changes})


# ------------------------------------------------------------------------------------------ seeds
def test_seeds_refuse_an_output_dir_that_holds_a_single_run_and_touch_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cause 1: exited 0 after overwriting the single run's config.yaml, metrics.json, rounds.jsonl and machine.json."""
    assert main(["run", *tiny(tmp_path, *ONE_ROUND)]) == 0
    single = tmp_path / "run"
    before = _fingerprint(single)
    assert main(["run", *tiny(tmp_path, *ONE_ROUND, "seeds=[0,1]")]) == 2
    assert "holds a single run's results" in error_of(capsys.readouterr().err)
    assert _fingerprint(single) == before


def test_a_replica_without_config_yaml_or_copied_from_another_seed_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cause 3: a copy of seed_0 placed as seed_1 without config.yaml was aggregated as a second seed (84 of 105 metrics
    wrong, seed std 0); with its config.yaml it names the seed."""
    assert main(["run", *tiny(tmp_path, *ONE_ROUND, "seeds=[0]")]) == 0
    seeds = tmp_path / "run"
    shutil.copytree(seeds / "seed_0", seeds / "seed_1")
    assert main(["run", *tiny(tmp_path, *ONE_ROUND, "seeds=[0,1]")]) == 2
    assert "seed 1:" in (err := error_of(capsys.readouterr().err)) and "seed (stored 0, given 1)" in err
    (seeds / "seed_1" / "config.yaml").unlink()
    before = _fingerprint(seeds)
    assert main(["run", *tiny(tmp_path, *ONE_ROUND, "seeds=[0,1]")]) == 2
    assert "seed_1/config.yaml: missing" in error_of(capsys.readouterr().err)
    assert _fingerprint(seeds) == before


@pytest.mark.parametrize(
    ("value", "named"), [('"0.5"', 'is "0.5"; a metric is a number or null'), ("[0.5]", "is [0.5]; a metric is a number")]
)
def test_a_replica_metric_that_is_not_a_number_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, named: str
) -> None:
    """Cause 4: a string value dropped the metric from the aggregate without a word; a list gave a traceback."""
    assert main(["run", *tiny(tmp_path, *ONE_ROUND, "seeds=[0]")]) == 0
    metrics = tmp_path / "run" / "seed_0" / "metrics.json"
    metrics.write_text(metrics.read_text().replace('"attack/public_mean/ssim": ', f'"attack/public_mean/ssim": {value}, "was": ', 1))
    assert main(["run", *tiny(tmp_path, *ONE_ROUND, "seeds=[0]")]) == 2
    err = error_of(capsys.readouterr().err)
    assert "attack/public_mean/ssim" in err and named in err


def test_seed_beside_seeds_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cause 4: seed=7 beside seeds=[0,1] was ignored while the aggregate's config.yaml recorded seed 7."""
    assert main(["run", *tiny(tmp_path, *ONE_ROUND, "seeds=[0,1]", "seed=7")]) == 2
    assert "seed=7 beside seeds=[0, 1]" in error_of(capsys.readouterr().err)
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text("seed: 7\nseeds: [0, 1]\n")  # issue 57: in an experiment file too
    assert main(["run", str(experiment), *tiny(tmp_path, *ONE_ROUND)]) == 2
    assert f"error: {experiment}: seed=7 beside seeds=[0, 1]" in error_of(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_a_moved_seeds_folder_continues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cause 7: its W&B group (the folder's name) was part of the check, so the refusal named logger.wandb.group."""
    assert main(["run", *tiny(tmp_path, *ONE_ROUND, "seeds=[0]")]) == 0
    shutil.move(tmp_path / "run", tmp_path / "moved")
    moved = ["run", *tiny(tmp_path, *ONE_ROUND, "seeds=[0,1]"), f"output_dir={tmp_path / 'moved'}"]
    assert main(moved) == 0
    assert json.loads((tmp_path / "moved" / "metrics.json").read_text())["seeds/count"] == 2


# ------------------------------------------------------------------------------------------ resume
def _checkpointed_run(tmp_path: Path) -> Path:
    assert main(["run", *tiny(tmp_path, *ONE_ROUND, "protocol.rounds=2", "checkpoint_every=1", "keep_checkpoints=3")]) == 0
    run = tmp_path / "run"
    (run / "metrics.json").unlink()  # as if killed after its last checkpoint
    return run


def test_a_refused_resume_never_advises_deleting_the_only_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cause 7: the advice "delete it to resume from an earlier checkpoint", followed twice, deleted every checkpoint and
    ended in "no checkpoint to resume from"; it now names the earlier checkpoint, or says to start afresh."""
    run = _checkpointed_run(tmp_path)
    resume = ["run", *tiny(tmp_path, *ONE_ROUND, "protocol.rounds=2", "checkpoint_every=1", "keep_checkpoints=3", "resume=true")]
    checkpoints = sorted((run / "checkpoints").glob("round_*.pt"))
    torch.save({"weights": 1}, checkpoints[-1])  # the newest one, broken
    assert main(resume) == 2
    err = error_of(capsys.readouterr().err)
    assert f"delete it to resume from {checkpoints[-2].name}" in err
    for path in checkpoints[:-1]:
        path.unlink()
    assert main(resume) == 2
    err = error_of(capsys.readouterr().err)
    assert "only checkpoint: start afresh in another output_dir" in err and "delete" not in err


# ------------------------------------------------------------------------------------------ the matrix
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"overrides": [*QUICK, "protocol.rounds=2"]}, "protocol.rounds (stored 1, given 2)"),
        ({"attacks": ["public_mean", "ldia", "lira_distill"]}, "attacks"),
        ({"defenses": {"none": ["defenses=[laplace]", "defense.laplace.scale=0.5"]}}, "defenses"),
    ],
    ids=["rounds", "added_attack", "same_name_other_defense"],
)
def test_a_changed_matrix_file_is_refused_over_its_old_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], named: str
) -> None:
    """Cause 2: after the file changed, a re-run said "1 done before, 0 to run", exited 0 and wrote a cell config.yaml
    that did not match its results (an added attack got no row); ``--list`` said "done"."""
    root = tmp_path / "root"
    assert run_matrix(_one_cell(tmp_path), root) == 0
    before = _fingerprint(root)
    (tmp_path / "changed").mkdir()
    changed = _one_cell(tmp_path / "changed", **change)
    assert run_matrix(changed, root) == 2
    err = error_of(capsys.readouterr().err)
    assert "1 of 1 simulations" in err and "made with other settings" in err and named in err
    assert _fingerprint(root) == before
    assert run_matrix(changed, root, "--list") == 0
    assert "\tstale: " in capsys.readouterr().out


def test_a_replica_of_the_matrix_without_config_yaml_is_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Causes 2 and 3 in the matrix: a simulation with metrics.json was counted done without its config being read."""
    root = tmp_path / "root"
    path = _one_cell(tmp_path)
    assert run_matrix(path, root) == 0
    (root / "digits/fedmd/none/seed_0/config.yaml").unlink()
    assert run_matrix(path, root) == 2
    assert "config.yaml: missing" in error_of(capsys.readouterr().err)


def _faulty_matrix_file(tmp_path: Path, fault: str) -> Path:
    """The one-cell matrix file with ``fault``."""
    base = yaml.safe_load(_one_cell(tmp_path).read_text())
    dump = lambda spec: yaml.safe_dump(spec, sort_keys=False)  # noqa: E731
    text = {
        "twice": dump({k: v for k, v in base.items() if k != "defenses"})
        + "defenses:\n  lap: ['defenses=[laplace]']\n  lap: ['defenses=[topk]']\n",
        "skip_typo": dump({**base, "skip": ["digits/fedmd/lapalce"]}),
        "skip_bracket": dump({**base, "skip": ["digits/[fedmd/none"]}),
        "seed": dump({**base, "overrides": [*QUICK, "seed=7"]}),
        "seeds": dump({**base, "defenses": {"none": ["seeds=[0,1]"]}}),
        "matrix_json": dump({**base, "data": {"matrix.json": ["data=digits"]}}),
    }[fault]
    path = tmp_path / "faulty.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("twice", "'lap' is given twice"),
        ("skip_typo", "'lapalce' matches none of defenses"),
        ("skip_bracket", "'[fedmd' matches none of protocols"),
        ("seed", "overrides: seed=7 would be ignored"),
        ("seeds", "defenses.none: seeds=[0,1] would be ignored"),
        ("matrix_json", "'matrix.json' is a name the matrix's own outputs take"),
    ],
)
def test_a_matrix_file_that_would_run_other_than_it_says_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, named: str
) -> None:
    """Cause 4 (a name given twice kept the last, so folder lap held a top-k run; a skip pattern that matched no cell was
    accepted; seed=/seeds= in overrides were ignored) and cause 6 (a data setting named matrix.json failed with a
    traceback after the simulations ran). Each is refused before anything runs."""
    assert run_matrix(_faulty_matrix_file(tmp_path, fault), tmp_path / "root") == 2
    assert named in error_of(capsys.readouterr().err)
    assert not (tmp_path / "root").exists()


def test_matrix_command_line_faults_are_one_line_and_list_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cause 6: an unwritable --root or --sweep-file and ``--cell ²`` gave tracebacks; cause 7: ``--cell 0 --list`` ran
    the simulation."""
    path = _one_cell(tmp_path)
    (tmp_path / "file").write_text("x")
    for extra, named in (
        (["--cell", "²"], "--cell ²: no such simulation"),
        (["--root", str(tmp_path / "file" / "below")], "cannot be created"),
        (["--sweep-file", str(tmp_path)], f"--sweep-file {tmp_path} cannot be written"),
        (["--sweep-file", str(tmp_path / "missing" / "sweep.yaml")], "cannot be written"),
    ):
        assert main(["matrix", str(path), *(extra if extra[0] == "--root" else ["--root", str(tmp_path / "root"), *extra])]) == 2
        assert named in error_of(capsys.readouterr().err)
    assert run_matrix(path, tmp_path / "root", "--cell", "0", "--list") == 0
    assert capsys.readouterr().out.strip() == "0\tdigits/fedmd/none/0\tto run"
    assert not (tmp_path / "root").exists()
