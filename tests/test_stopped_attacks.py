"""An attack stopped after it had scored has no final score: NaN (null) with its ``stopped`` reason in ``metrics.json``,
the closing table, the seeds' aggregate and the matrix, whose cell says so and runs that simulation again next time,
the earlier run set aside (issue 57: a killed worker's round-1 KL was reported as final and averaged with the other
seeds' last rounds)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Iterator

import pytest

from fdattack import plugins
from fdattack.attacks import ATTACKS
from fdattack.cli import main
from fdattack.tracking.seed_aggregate import aggregate_metrics
from fdattack.tracking.summary import attack_summary
from tests.conftest import tiny
from tests.test_matrix import QUICK, matrix_file, run_matrix


def test_an_attack_stopped_at_one_seed_has_no_mean_over_the_others() -> None:
    finished = {"attack/ldia/kl": 0.5, "attack/ldia/kl_ci_low": 0.4, "attack/ldia/kl_ci_high": 0.6, "attack/other/kl": 0.1}
    stopped = {"attack/ldia/kl": 0.9, "attack/ldia/stopped/seconds": 1.0, "attack/other/kl": 0.3}
    aggregate = aggregate_metrics([finished, stopped, finished])
    assert math.isnan(aggregate["attack/ldia/kl"]) and math.isnan(aggregate["attack/ldia/kl_ci_low"])
    assert aggregate["attack/ldia/stopped/seconds"] == 1.0
    assert aggregate["attack/other/kl"] == pytest.approx((0.1 + 0.3 + 0.1) / 3)  # the other attack's mean is untouched
    table = attack_summary(aggregate)
    assert "ldia: stopped (seconds); no final score" in table and "0.9" not in table


@pytest.fixture
def faulty_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``tests/faulty_attacks.py`` loadable by ``plugins=[...]`` for this test only: its attack registers into a copy of
    the registry, so no other test lists it."""
    monkeypatch.setattr(ATTACKS, "_items", dict(ATTACKS._items))
    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))
    sys.modules.pop("tests.faulty_attacks", None)
    yield
    sys.modules.pop("tests.faulty_attacks", None)


@pytest.mark.parametrize("mode", ["in_process", "process"])
def test_a_run_that_stopped_an_attack_says_so_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], faulty_plugin: None, mode: str
) -> None:
    """Issue 58: in process, a plugin's attack that raised ended the run with a traceback (exit 1, the round's other
    results lost); isolated, the run said one line and exited 0. Both now stop that attack with one line and exit 3."""
    overrides = ["protocol.rounds=2", "attacks=[ldia,ldia_dies]", "plugins=[tests.faulty_attacks]", f"isolation.mode={mode}"]
    assert main(["run", *tiny(tmp_path, *overrides, "evaluation.confidence_gap.enabled=false")]) == 3
    err = capsys.readouterr().err
    assert "fdattack: the run finished with 1 attack(s) stopped: ldia_dies (failed); their final scores are null" in err
    assert "Traceback" not in err
    final = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert final["attack/ldia_dies/kl"] is None and isinstance(final["attack/ldia/kl"], float)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert isinstance(rounds[1]["attack/ldia_dies/kl"], float) and rounds[2]["attack/ldia_dies/stopped/failed"] == 1.0
    assert "this attack fails from its second round on" in (tmp_path / "run" / "attack_state" / "ldia_dies.log").read_text()


def test_a_plugin_s_attack_that_cannot_be_built_in_process_is_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, faulty_plugin: None
) -> None:
    overrides = ["attacks=[ldia,ldia_unbuilt]", "plugins=[tests.faulty_attacks]", "evaluation.confidence_gap.enabled=false"]
    assert main(["run", *tiny(tmp_path, *overrides, "protocol.rounds=1")]) == 3
    lines = [r.getMessage() for r in caplog.records if "ldia_unbuilt stopped" in r.getMessage()]
    assert len(lines) == 1 and "it could not be built (ValueError: this attack cannot be built)" in lines[0]
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert rounds[1]["attack/ldia_unbuilt/stopped/failed"] == 1.0 and isinstance(rounds[1]["attack/ldia/kl"], float)


def test_a_plugin_s_attack_stopped_in_process_stays_stopped_on_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, faulty_plugin: None
) -> None:
    overrides = ["attacks=[ldia,ldia_dies]", "plugins=[tests.faulty_attacks]", "evaluation.confidence_gap.enabled=false"]
    args = ["run", *tiny(tmp_path, *overrides, "protocol.rounds=3", "keep_checkpoints=3")]
    assert main(args) == 3
    finished = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    (tmp_path / "run" / "checkpoints" / "round_0003.pt").unlink()  # resumed after round 2, where it was stopped
    caplog.clear()
    assert main([*args, "resume=true"]) == 3
    assert not [r for r in caplog.records if "ldia_dies stopped" in r.getMessage()]  # its checkpoint says so: not run again
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert [row.get("attack/ldia_dies/stopped/failed") for row in rounds] == [None, None, 1.0, 1.0]
    assert rounds[3]["attack/ldia/kl"] == finished[3]["attack/ldia/kl"]


def test_fdattack_s_own_attack_failing_in_process_ends_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a plugin's: its error is fdattack's bug, and surfaces as such."""
    from fdattack.attacks.ldia import LDIAAttack

    def fails(self: LDIAAttack, round: int) -> list:
        raise RuntimeError("fdattack's bug")

    monkeypatch.setattr(LDIAAttack, "on_round_end", fails)
    with pytest.raises(RuntimeError, match="fdattack's bug"):
        main(["run", *tiny(tmp_path, "attacks=[ldia]", "protocol.rounds=1", "evaluation.confidence_gap.enabled=false")])


def test_a_matrix_cell_with_a_stopped_attack_says_so_and_runs_it_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], faulty_plugin: None
) -> None:
    """Two rounds isolated: ``ldia_dies`` scores round 1 and fails in round 2. Its replica's final KL is null beside
    ``stopped/failed``, LDIA's is a number; the cell shows it stopped and the next invocation runs the seed again."""
    path = matrix_file(
        tmp_path,
        overrides=[*QUICK, "protocol.rounds=2", "plugins=[tests.faulty_attacks]"],
        protocols={"fedmd": ["protocol=fedmd"]},
        defenses={"none": []},
        attacks=["ldia", "ldia_dies"],
        seeds=[0],
    )
    root = tmp_path / "root"
    assert run_matrix(path, root, "--isolation", "process") == 0
    out = capsys.readouterr().out
    assert "digits/fedmd/none/0: stopped ldia_dies (failed), which run again next time" in out, out
    seed_0 = root / "digits/fedmd/none/seed_0"
    final = json.loads((seed_0 / "metrics.json").read_text())
    assert final["attack/ldia_dies/stopped/failed"] == 1.0 and final["attack/ldia_dies/kl"] is None
    assert isinstance(final["attack/ldia/kl"], float)
    rounds = [json.loads(line) for line in (seed_0 / "rounds.jsonl").read_text().splitlines()]
    assert isinstance(rounds[1]["attack/ldia_dies/kl"], float)  # it did score round 1: that is not its answer
    assert "ldia_dies: stopped (failed); no final score" in (root / "digits/fedmd/none/seed_0.log").read_text()
    matrix = json.loads((root / "matrix.json").read_text())
    (cell,) = matrix["cells"]
    assert cell["status"] == "done" and cell["stopped"] == {"ldia_dies": "failed"}
    assert cell["metrics"]["attack/ldia_dies/kl"]["mean"] is None and cell["metrics"]["attack/ldia_dies/kl"]["values"] == [None]
    assert cell["metrics"]["attack/ldia/kl"]["mean"] is not None
    assert "stopped" in (root / "matrix.csv").read_text()
    assert run_matrix(path, root, "--isolation", "process") == 0  # runs that seed again, the earlier run kept aside
    assert "1 to run" in capsys.readouterr().out
    assert (root / "digits/fedmd/none/seed_0.stopped-1/metrics.json").is_file() and (seed_0 / "metrics.json").is_file()
