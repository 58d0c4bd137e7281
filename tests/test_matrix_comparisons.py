"""The matrix's paired comparisons (each defense against no defense, seed by seed, Holm over the whole family), checked
against values computed by hand, and shown on the page and in the summary."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fdattack.matrix.cell_result import CellResult
from fdattack.matrix.comparisons import comparisons_summary, defense_comparisons
from fdattack.matrix.outputs import to_json
from fdattack.matrix.page import comparisons_html
from fdattack.matrix.plan import Cell
from fdattack.matrix.spec import MatrixSpec

KEY = "attack/ldia/kl"
ACC = "protocol/client_acc_mean"


def _spec() -> MatrixSpec:
    return MatrixSpec(
        name="t",
        experiment=None,
        overrides=(),
        seeds=(0, 1, 2),
        data={"d": ()},
        protocols={"p": ()},
        defenses={"none": (), "lap": ("defenses=[laplace]",), "topk": ("defenses=[topk]",)},
        attacks=("ldia",),
        source=Path("t.yaml"),
    )


def _result(defense: str, kl: list[float], acc: list[float], seeds: tuple[int, ...] = (0, 1, 2)) -> CellResult:
    per_seed = [{KEY: k, ACC: a} for k, a in zip(kl, acc)]
    aggregate = {KEY: sum(kl) / len(kl), ACC: sum(acc) / len(acc)}
    return CellResult(Cell("d", "p", defense, attacks=("ldia",)), "done", seeds=list(seeds), per_seed=per_seed, aggregate=aggregate)


def test_each_defense_is_paired_with_no_defense_seed_by_seed_and_holm_decides_what_survives() -> None:
    results = [
        _result("none", [1.0, 1.2, 1.4], [0.80, 0.82, 0.84]),
        _result("lap", [2.0, 2.3, 2.5], [0.80, 0.82, 0.84]),  # KL differences 1.0, 1.1, 1.1; accuracy unchanged
        _result("topk", [1.1, 1.0, 1.7], [0.70, 0.72, 0.73]),  # KL differences 0.1, -0.2, 0.3; accuracy -0.10, -0.10, -0.11
    ]
    comparisons = defense_comparisons(_spec(), results, [KEY, ACC])
    by = {(c.defense, c.metric): c for c in comparisons}
    assert len(comparisons) == 4  # lap's accuracy is listed though no seed moved it
    lap = by["lap", KEY]
    assert lap.baseline == "none" and lap.seeds == [0, 1, 2]
    assert lap.baseline_values == [1.0, 1.2, 1.4] and lap.values == [2.0, 2.3, 2.5]
    assert lap.mean == pytest.approx(3.2 / 3)
    # t interval by hand: sd of (1.0, 1.1, 1.1) = 0.057735, sem = 0.033333, t(0.975, 2) = 4.302653
    assert (lap.ci_low, lap.ci_high) == pytest.approx((3.2 / 3 - 4.302653 * 0.0333333, 3.2 / 3 + 4.302653 * 0.0333333), abs=1e-5)
    # paired t with 2 df: two-sided p = 1 - t / sqrt(t^2 + 2); t = 1.0667 / 0.03333 = 32.0 gives 0.000975
    assert lap.p_value == pytest.approx(1 - 32 / (32**2 + 2) ** 0.5, rel=1e-6)
    topk_acc = by["topk", ACC]  # t = -0.10333 / 0.0033333 = -31.0: p = 0.001039
    assert topk_acc.p_value == pytest.approx(1 - 31 / (31**2 + 2) ** 0.5, rel=1e-6)
    # Holm over the 3 tested (lap's unchanged accuracy has no t test and is left out): 3 p_(1), then max(that, 2 p_(2))
    assert lap.p_holm == pytest.approx(3 * lap.p_value) and lap.survives
    assert topk_acc.p_holm == pytest.approx(max(3 * lap.p_value, 2 * topk_acc.p_value)) and topk_acc.survives
    assert not by["topk", KEY].survives and by["topk", KEY].p_holm == min(1.0, by["topk", KEY].p_value)
    assert not by["lap", ACC].survives and math.isnan(by["lap", ACC].p_holm)


def test_only_seeds_both_cells_recorded_are_paired() -> None:
    results = [_result("none", [1.0, 1.2, 1.4], [0.8] * 3), _result("lap", [2.0, 2.3], [0.8] * 2, seeds=(0, 2))]
    (comparison,) = [c for c in defense_comparisons(_spec(), results, [KEY]) if c.defense == "lap"]
    assert comparison.seeds == [0, 2] and comparison.baseline_values == [1.0, 1.4] and comparison.values == [2.0, 2.3]


def test_matrix_json_summary_and_page_show_the_survivors_with_their_seeds() -> None:
    results = [
        _result("none", [1.0, 1.2, 1.4], [0.80, 0.82, 0.84]),
        _result("lap", [2.0, 2.3, 2.5], [0.80, 0.82, 0.84]),
        _result("topk", [1.1, 1.0, 1.7], [0.70, 0.72, 0.73]),
    ]
    matrix = to_json(_spec(), results)
    assert matrix["comparisons"]["family_size"] == 3
    summary = comparisons_summary(matrix["comparisons"])
    assert summary.startswith("against no defense, seed by seed: 2 of 3 paired differences survive")
    assert "d/p attack/ldia/kl: lap − none +1.07 [+0.923, +1.21] (seed 0: 1 → 2, 1: 1.2 → 2.3, 2: 1.4 → 2.5;" in summary
    page = comparisons_html(matrix)
    assert "2 of the 3 comparisons" in page and "0: 1 → 2; 1: 1.2 → 2.3; 2: 1.4 → 2.5" in page
    assert "topk" in page and page.count("<tr>") == 3  # header and the two survivors


def test_a_matrix_without_an_undefended_setting_compares_nothing() -> None:
    spec = _spec()
    spec.defenses.pop("none")
    assert defense_comparisons(spec, [_result("lap", [1, 2, 3], [0.8] * 3)], [KEY]) == []


def test_after_decide_the_comparisons_are_tested_and_drawn_at_the_verdicts_alpha() -> None:
    from scipy import stats

    from fdattack.matrix.decide import Design, SeedState

    results = [
        _result("none", [1.0, 1.2, 1.4], [0.80, 0.82, 0.84]),
        _result("lap", [2.0, 2.3, 2.5], [0.80, 0.82, 0.84]),
        _result("topk", [1.1, 1.0, 1.7], [0.70, 0.72, 0.73]),
    ]
    design = Design((0, 1, 2), max_seeds=20, batch=1)  # 18 looks: each test at 0.05 / 18 = 0.00278
    matrix = to_json(_spec(), results, SeedState(design))
    alpha = 0.05 / 18
    assert matrix["alpha"] == matrix["comparisons"]["alpha"] == pytest.approx(alpha)
    rows = {(r["defense"], r["metric"]): r for r in matrix["comparisons"]["rows"]}
    lap = rows["lap", KEY]
    # Holm's p is 3 × 0.000975 = 0.0029 as at 0.05, where it survives; at α/K it does not
    assert lap["p_holm"] == pytest.approx(3 * (1 - 32 / (32**2 + 2) ** 0.5), rel=1e-6) and not lap["survives"]
    # the interval at 1 − α/K: t(1 − α/2K, 2) × sem 0.0333333
    assert lap["ci_high"] - lap["mean"] == pytest.approx(float(stats.t.ppf(1 - alpha / 2, 2)) * 0.1 / 3, rel=1e-6)
    assert "its 99.72 % t interval" in comparisons_html(matrix) and "family-wise 0.00277778" in comparisons_html(matrix)
