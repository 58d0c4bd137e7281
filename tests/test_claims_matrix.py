"""The README's and docs/matrix.md's claims about the small preset, re-decided from the kept ``results/matrix/small/``.

The matrix's figures come from ``fdattack matrix conf/matrix/small.yaml --jobs 2 --decide`` (about two hours on 2
cores, too long for the suite); its ``matrix.json`` keeps every cell's per-seed values, so each claim the pages make of it is checked
here against what the verdict rule (:func:`fdattack.matrix.answer.answers`) decides from those seeds. A claim
whose cell stops deciding that way, or a count the pages quote that the kept results do not give, fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fdattack.matrix.answer import Answer, answers
from fdattack.matrix.comparisons import comparisons_summary
from fdattack.matrix.decide import verdict_counts
from fdattack.matrix.spec import load_matrix
from fdattack.statistics.verdicts import Verdict

REPO = Path(__file__).resolve().parents[1]
KEPT = REPO / "results" / "matrix" / "small"
PAGES = (REPO / "README.md", REPO / "docs" / "matrix.md")


@pytest.fixture(scope="module")
def matrix() -> dict:
    return json.loads((KEPT / "matrix.json").read_text())


@pytest.fixture(scope="module")
def rows(matrix: dict) -> dict[tuple[str, str, str], Answer]:
    return {(a.attack, a.data, a.protocol): a for a in answers(matrix)}


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_kept_matrix_was_made_by_the_preset_the_pages_name(matrix: dict) -> None:
    """What is read back is checked against what made it: the preset's name, seeds, axes, control runs, margins and
    ``--decide`` design (whose looks set the α every verdict here is read at)."""
    spec = load_matrix(REPO / "conf" / "matrix" / "small.yaml")
    design = spec.design()
    assert (matrix["name"], matrix["seeds"]) == (spec.name, list(spec.seeds))
    axes = {"data": spec.data, "protocols": spec.protocols, "defenses": spec.defenses, "attacks": spec.attacks}
    assert matrix["axes"] == {key: list(value) for key, value in axes.items()}
    assert matrix["control"] == {data: list(overrides) for data, overrides in spec.control.items()}
    assert matrix["margins"] == dict(spec.margins)
    kept = matrix["decide"]["design"]
    assert (kept["first"], kept["max_seeds"], kept["batch"], kept["budget_minutes"]) == (
        list(design.first),
        design.max_seeds,
        design.batch,
        design.budget_minutes,
    )
    assert matrix["alpha"] == kept["alpha"] == design.alpha
    assert json.loads((KEPT / "seeds.json").read_text()) == matrix["decide"]


def test_every_cell_that_ran_kept_at_least_three_seeds(matrix: dict) -> None:
    ran = [c for c in matrix["cells"] if c["status"] != "n/a"]
    short = [c["id"] for c in ran if len(c["seeds"]) < 3]
    assert len(ran) >= 60
    assert not short, f"cells with fewer than 3 seeds: {short}"


def test_the_pages_quote_the_verdict_counts_the_kept_seeds_give(rows: dict) -> None:
    counts = verdict_counts(list(rows.values()))["undefended"]
    sentence = (
        f"of {len(rows)} undefended places, {counts['leaks']} leak beyond their control, {counts['stopped']} are shown "
        f"within the margin of it and {counts['undecided']} are undecided"
    )
    for page in PAGES:
        assert sentence in _flat(page.read_text(encoding="utf-8")).lower(), f"{page.name} does not say: {sentence}"


@pytest.mark.parametrize(
    "attack, data, protocol",
    [
        ("gmi", "mnist_gan", "fedavg"),
        ("kedmi", "mnist_gan", "fedavg"),
        ("lattack", "mnist_lattack", "fedmd"),
        ("lira_distill", "mnist", "cronus"),
        ("rmia_distill", "mnist", "cronus"),
        ("ldia", "att_faces", "fedmd"),
        ("ldia", "mnist", "fedmd"),
    ],
)
def test_the_leaks_the_readme_names_leak_beyond_their_control(rows: dict, attack: str, data: str, protocol: str) -> None:
    a = rows[(attack, data, protocol)]
    assert a.decision.verdict is Verdict.leaks, (a.decision.verdict, a.decision.low, a.decision.high)
    assert a.decision.n >= 3


@pytest.mark.parametrize("protocol", ["fedmd", "fedgems", "dsfl"])
def test_pli_on_att_faces_is_shown_within_one_chance_level_of_its_public_only_control(rows: dict, protocol: str) -> None:
    a = rows[("pli", "att_faces", protocol)]
    assert a.decision.verdict is Verdict.stopped, (a.decision.mean, a.decision.upper, a.decision.margin)
    assert {"pli/prior_accuracy", "public_mean/accuracy"} <= set(a.control.sources)


@pytest.mark.parametrize(
    "attack, data, protocol, cheapest",
    [
        ("lattack", "mnist_lattack", "fedmd", "laplace_0.5"),
        ("kedmi", "mnist_gan", "fedavg", "dpsgd_1"),
        ("vmi", "mnist_gan", "fedavg", "dpsgd_1"),
        ("ldia", "att_faces", "fedmd", "dpsgd_0.5"),
    ],
)
def test_the_cheapest_stops_the_readme_names_are_shown(rows: dict, attack: str, data: str, protocol: str, cheapest: str) -> None:
    a = rows[(attack, data, protocol)]
    assert a.cheapest is not None and a.cheapest.defense == cheapest
    assert a.cheapest.decision.verdict is Verdict.stopped


def test_gmi_has_no_stop_shown_but_dpsgd_reduces_it(rows: dict) -> None:
    a = rows[("gmi", "mnist_gan", "fedavg")]
    assert a.cheapest is None
    assert [s.defense for s in a.settings if s.reduces] == ["dpsgd_1"]


def test_labelavg_holds_the_lattack_within_the_margin_of_its_control(rows: dict) -> None:
    a = rows[("lattack", "mnist_lattack", "labelavg")]
    assert a.decision.verdict is Verdict.stopped
    assert a.value.mean == 0.0


def test_the_readme_quotes_the_differences_that_survive_holm(matrix: dict) -> None:
    found = re.search(r"(\d+) of (\d+) paired differences survive", comparisons_summary(matrix["comparisons"]))
    assert found, "the comparisons' summary names no count"
    survivors, total = found.groups()
    assert int(survivors) > 0
    sentence = f"{survivors} of the {total} defended-versus-undefended differences survive Holm's correction"
    assert sentence in _flat((REPO / "README.md").read_text(encoding="utf-8")), sentence
