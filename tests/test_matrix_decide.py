"""``fdattack matrix FILE --decide``: seeds in batches to the cells whose verdict is undecided, each look at α/K, up
to ``max_seeds``; the design kept in ``seeds.json`` and refused when the file changes it; a plain run afterwards keeps
the seeds and the α."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import error_of
from test_matrix import matrix_file, run_matrix

from fdattack.matrix.answer import Answer, Control, Setting
from fdattack.matrix.decide import (
    SEEDS_FILE,
    Design,
    SeedState,
    affordable,
    batch_minutes,
    cells_to_extend,
    design_of,
    load_state,
    save_state,
)
from fdattack.matrix.shown import Shown
from fdattack.statistics.verdicts import Decision, Verdict


def test_the_design_plans_its_looks_and_spends_alpha_over_them() -> None:
    """Three seeds, then two a look up to 10: looks at 3, 5, 7, 9, 10 seeds, K = 5, each at 0.05 / 5; new seeds count on
    from the largest of the first."""
    design = Design((0, 1, 2), max_seeds=10, batch=2)
    assert design.looks == 5 and design.alpha == pytest.approx(0.01)
    assert design.next_seeds([0, 1, 2]) == [0, 1, 2, 3, 4] and design.next_seeds([0, 1, 2, 3, 4, 5, 6, 7, 8]) == [*range(10)]
    assert Design((42, 0, 1), max_seeds=4, batch=3).next_seeds([42, 0, 1]) == [42, 0, 1, 43]
    assert Design((0, 1, 2), max_seeds=3).looks == 1  # no room: one look at the full α
    for bad, named in (({"max_seeds": 2}, "max_seeds"), ({"batch": 0}, "batch"), ({"budget_minutes": -1}, "budget_minutes")):
        with pytest.raises(Exception, match=named):
            design_of((0, 1, 2), bad, "m.yaml")


def test_a_batch_goes_only_to_the_places_whose_simulations_end_within_the_budget() -> None:
    """A cell's batch costs its simulations' mean wall time times the batch; places (a place's cells, its control among
    them, get seeds together) are taken cheapest first while their summed cost over the jobs, and the longest cell's,
    fit in the minutes left."""
    assert batch_minutes([{"time/total_s": 60.0}, {"time/total_s": 120.0}, {}], 2) == pytest.approx(3.0)
    assert batch_minutes([{"accuracy": 1.0}], 2) == 0.0  # nothing recorded: no cost known
    costs = {"faces/fedmd/none": 4.0, "faces/fedmd/control": 2.0, "mnist/dsfl/none": 1.0, "mnist/dsfl/dpsgd_1": 10.0}
    costs["gan/fedavg/none"] = 3.0
    assert affordable(costs, 100.0, 2) == sorted(costs)
    assert affordable(costs, 4.0, 2) == ["gan/fedavg/none"]  # then faces/fedmd: (3 + 6) / 2 = 4.5 > 4
    assert affordable(costs, 5.0, 2) == ["faces/fedmd/control", "faces/fedmd/none", "gan/fedavg/none"]  # mnist/dsfl: 10 > 5
    assert affordable(costs, 2.9, 2) == []  # the cheapest place (gan, 3 minutes) is longer than what is left
    assert affordable(costs, 3.0, 1) == ["gan/fedavg/none"]


def test_the_minutes_spent_survive_a_resumed_run(tmp_path: Path) -> None:
    """seeds.json keeps the minutes every invocation spent, so a stopped and resumed run spends one budget; a file
    written before the minutes were kept reads its last look's."""
    state = SeedState(Design((0, 1, 2)), minutes=12.5)
    save_state(tmp_path, state)
    assert load_state(tmp_path, Design((0, 1, 2))).minutes == pytest.approx(12.5)
    raw = json.loads((tmp_path / SEEDS_FILE).read_text())
    del raw["minutes"]
    raw["looks"] = [{"look": 1, "minutes": 7.25}]
    (tmp_path / SEEDS_FILE).write_text(json.dumps(raw))
    assert load_state(tmp_path, Design((0, 1, 2))).minutes == pytest.approx(7.25)


def _answer(verdict: Verdict, settings: dict[str, Verdict]) -> Answer:
    def decision(v: Verdict) -> Decision:
        return Decision(v, 0.1, 0.0, 0.2, 0.2, 0.05, 3, 0.05)

    control = Control({}, ())
    rows = [Setting(name, name, Shown(0.1), control, decision(v), 0.0, False) for name, v in settings.items()]
    return Answer("pli", "attack/pli/accuracy", "faces", "fedmd", Shown(0.3), control, decision(verdict), rows)


def test_the_cells_a_verdict_waits_on() -> None:
    """An undecided attack waits on its undefended cell; where it leaks or is undecided, each undecided defense setting
    waits too, and with them the place's control run; a place whose attack is shown within δ waits on nothing."""
    cells = {"faces/fedmd/none", "faces/fedmd/laplace_1", "faces/fedmd/laplace_2", "faces/fedmd/control"}
    leaks = _answer(Verdict.leaks, {"laplace_1": Verdict.undecided, "laplace_2": Verdict.stopped})
    assert cells_to_extend([leaks], "none", cells) == {"faces/fedmd/laplace_1", "faces/fedmd/control"}
    undecided = _answer(Verdict.undecided, {"laplace_1": Verdict.leaks})
    assert cells_to_extend([undecided], "none", cells) == {"faces/fedmd/none", "faces/fedmd/control"}
    within = _answer(Verdict.stopped, {"laplace_1": Verdict.undecided})
    assert cells_to_extend([within], "none", cells) == set()


def test_decide_adds_seeds_to_undecided_cells_and_a_plain_run_keeps_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """LDIA on FedMD with and without Laplace noise at 2 seeds is undecided against a margin of 0.001 nats; --decide adds
    one seed a look up to 3 (K = 2 looks, α = 0.025 each). seeds.json and matrix.json say so; the page lists each
    cell's seeds; a plain run afterwards runs nothing and reads the 3 seeds at the same α; another decide: is refused."""
    changes = {
        "protocols": {"fedmd": ["protocol=fedmd"]},
        "attacks": ["ldia"],
        "margins": {"kl": 0.001},
        "decide": {"max_seeds": 3, "batch": 1},
    }
    path, root = matrix_file(tmp_path, **changes), tmp_path / "root"
    assert run_matrix(path, root, "--decide") == 0
    out = capsys.readouterr().out
    assert "4 simulations, 0 done before" in out and "6 simulations, 4 done before, 2 to run" in out
    seeds = json.loads((root / "seeds.json").read_text())
    assert seeds["design"]["looks"] == 2 and seeds["design"]["alpha"] == pytest.approx(0.025)
    assert {cell: entry["seeds"] for cell, entry in seeds["cells"].items()} == {
        "digits/fedmd/none": [0, 1, 2],
        "digits/fedmd/laplace": [0, 1, 2],
    }
    assert [look["look"] for look in seeds["looks"]] == [1, 2] and seeds["looks"][0]["why"] == "2 cell(s) get 1 more seed(s)"
    matrix = json.loads((root / "matrix.json").read_text())
    assert matrix["alpha"] == pytest.approx(0.025) and all(c["seeds"] == [0, 1, 2] for c in matrix["cells"])
    assert "Seeds until decided" in (root / "page" / "index.html").read_text()

    assert run_matrix(path, root) == 0  # a plain run: the extended seeds, the spent α
    assert "6 simulations, 6 done before, 0 to run" in capsys.readouterr().out
    assert json.loads((root / "matrix.json").read_text())["alpha"] == pytest.approx(0.025)

    changed = matrix_file(tmp_path, **{**changes, "decide": {"max_seeds": 5, "batch": 1}})
    assert run_matrix(changed, root) == 2
    assert "seeds.json was made with decide" in error_of(capsys.readouterr().err)
