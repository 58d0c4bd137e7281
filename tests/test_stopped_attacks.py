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


def test_a_run_that_stopped_an_attack_says_so_and_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str], faulty_plugin: None) -> None:
    overrides = ["protocol.rounds=2", "attacks=[ldia,ldia_dies]", "plugins=[tests.faulty_attacks]", "isolation.mode=process"]
    assert main(["run", *tiny(tmp_path, *overrides, "evaluation.confidence_gap.enabled=false")]) == 3
    err = capsys.readouterr().err
    assert "fdattack: the run finished with 1 attack(s) stopped: ldia_dies (failed); their final scores are null" in err
    final = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert final["attack/ldia_dies/kl"] is None and isinstance(final["attack/ldia/kl"], float)


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
