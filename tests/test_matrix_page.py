"""The page of ``fdattack matrix`` (a heatmap and a table per dataset and headline metric, n/a reasons on hover and in a
list, intervals that may be missing, installed whole) renders in headless Chromium with its images loaded; the W&B
summary run logs the matrix as a table and the heatmaps as images, offline, and nothing when disabled."""

from __future__ import annotations

import copy
import html
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fdattack.config import WandbConfig
from fdattack.errors import ConfigError
from fdattack.matrix.answer import answers, baseline_of, per_defense, sentence
from fdattack.matrix.page import (
    HEATMAP_PREFIX,
    MATRIX_COLUMNS,
    applicable_columns,
    colour_scale,
    curve_paths,
    holds,
    matrix_rows,
    tradeoff_points,
    write_matrix_page,
)
from fdattack.matrix.shown import Shown
from fdattack.matrix.wandb_summary import MATRIX_JOB_TYPE, log_matrix_summary
from fdattack.statistics.intervals import wilson_interval, within_variance
from fdattack.statistics.verdicts import Verdict
from tests.test_report import chromium
from tests.test_wandb import finished_records

T2 = 4.302652729749462  # t_{2, 0.975}: three seeds

HEADLINE = ["attack/tbi/accuracy", "attack/tbi/eval_top1", "attack/ldia/kl"]
UTILITY = ["protocol/client_acc_mean", "protocol/server_acc", "comm/upload_bytes", "comm/download_bytes"]
NO_WEIGHTS = (
    "attacks: gmi needs the global model's weights (white_box), which protocol.name=fedmd does not offer here; remove gmi from attacks"
)
#: the reasons of the fedavg cells (one n/a cell, three n/a attacks), verbatim from a real run
FEDAVG_NA = {
    "tbi": "attacks: tbi needs a public set (public_data), the clients' outputs on public data (public_outputs), which "
    "protocol.name=fedavg does not offer here; remove tbi from attacks",
    "ldia": "attacks: ldia needs uploads of outputs on public data (output_uploads), which protocol.name=fedavg does not offer "
    "here; remove ldia from attacks",
    "gmi": "attacks: gmi needs labeled prior data of the attacker's own (prior_data), which data.split=pli does not offer; set "
    "data.split=classes and data.public_classes (the attacker's prior data)",
}
NO_LAPLACE = (
    "defenses: laplace needs uploads of outputs on public data (output_uploads), which protocol.name=fedavg does not offer "
    "here; remove laplace from defenses"
)


def metric(mean: float | None, low: float | None, high: float | None, *values: float | None) -> dict[str, Any]:
    numbers = [v for v in values if v is not None]
    std = float(np.std(numbers, ddof=1)) if len(numbers) > 1 else None
    return {"mean": mean, "ci_low": low, "ci_high": high, "seed_std": std, "values": list(values)}


def cell(protocol: str, defense: str, status: str = "done", reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"digits/{protocol}/{defense}",
        "data": "digits",
        "protocol": protocol,
        "defense": defense,
        "status": status,
        "reason": reason,
        "attacks": [],
        "not_applicable": {},
        "seeds": [0, 1] if status == "done" else [],
        "metrics": {},
        **extra,
    }


def sample_matrix() -> dict[str, Any]:
    """A real ``matrix.json`` (digits × {fedmd, fedavg} × {none, laplace}, attacks tbi, ldia, gmi, seeds 0 and 1), its
    metrics trimmed to the headline and utility ones; fedmd/laplace's KL has a NaN interval."""
    fedmd = {
        "protocol/client_acc_mean": metric(0.6062, 0.4567, 0.7557, 0.5944, 0.6180),
        "protocol/server_acc": metric(0.0, 0.0, 0.0, 0.0, 0.0),
        "comm/upload_bytes": metric(107720.0, 105178.76, 110261.24, 107520.0, 107920.0),
        "comm/download_bytes": metric(107720.0, 105178.76, 110261.24, 107520.0, 107920.0),
        "attack/tbi/chance": metric(0.2, 0.2, 0.2, 0.2, 0.2),
    }
    return {
        "name": "tiny",
        "source": "tiny.yaml",
        "seeds": [0, 1],
        "axes": {"data": ["digits"], "protocols": ["fedmd", "fedavg"], "defenses": ["none", "laplace"], "attacks": ["tbi", "ldia", "gmi"]},
        "headline": {"tbi": HEADLINE[:2], "ldia": HEADLINE[2:], "gmi": []},
        "utility": UTILITY,
        "cells": [
            cell(
                "fedmd",
                "none",
                attacks=["tbi", "ldia"],
                not_applicable={"gmi": NO_WEIGHTS},
                metrics={
                    **fedmd,
                    "attack/tbi/accuracy": metric(0.1, -1.1706, 1.3706, 0.2, 0.0),
                    "attack/tbi/eval_top1": metric(0.3, -3.5119, 4.1119, 0.6, 0.0),
                    "attack/ldia/kl": metric(0.2359, -0.4181, 0.8900, 0.1844, 0.2874),
                },
            ),
            cell(
                "fedmd",
                "laplace",
                attacks=["tbi", "ldia"],
                not_applicable={"gmi": NO_WEIGHTS},
                metrics={
                    **fedmd,
                    "protocol/client_acc_mean": metric(0.5615, 0.3442, 0.7789, 0.5444, 0.5787),
                    "attack/tbi/accuracy": metric(0.0, 0.0, 0.0, 0.0, 0.0),
                    "attack/tbi/eval_top1": metric(0.0, 0.0, 0.0, 0.0, 0.0),
                    "attack/ldia/kl": metric(0.3612, math.nan, math.nan, 0.3054, 0.4169),
                },
            ),
            cell(
                "fedavg",
                "none",
                not_applicable=FEDAVG_NA,
                metrics={
                    "comm/upload_bytes": metric(6440.0, 6440.0, 6440.0, 6440.0, 6440.0),
                    "comm/download_bytes": metric(6440.0, 6440.0, 6440.0, 6440.0, 6440.0),
                    "protocol/server_acc": metric(0.3298, -0.1905, 0.8501, 0.2889, 0.3708),
                },
            ),
            cell("fedavg", "laplace", "n/a", NO_LAPLACE),
        ],
    }


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page of :func:`sample_matrix`; returns its index.html."""
    return write_matrix_page(sample_matrix(), tmp_path_factory.mktemp("matrix") / "page")


def section(page: str, tag: str, attribute: str, value: str) -> str:
    """The first ``<tag ... attribute='value'>...</tag>`` of the page."""
    match = re.search(rf"<{tag}[^>]*{attribute}='{re.escape(value)}'[^>]*>.*?</{tag}>", page, flags=re.DOTALL)
    assert match, f"no <{tag} {attribute}={value!r}>"
    return match.group(0)


def cells_of(table: str) -> list[list[str]]:
    """The text of each body row's cells (the row header first)."""
    rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.DOTALL)[1:]
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)] for row in rows]


# ------------------------------------------------------------------------------------------------- the page
def test_a_heatmap_and_a_table_per_dataset_and_headline_metric(page: Path) -> None:
    text = page.read_text()
    figures = re.findall(r"<figure class='heatmap' data-metric='([^']*)'>.*?<img src='([^']*)'", text, flags=re.DOTALL)
    assert [m for m, _ in figures] == HEADLINE
    assert sorted(p.name for p in (page.parent / "plots").glob(f"{HEATMAP_PREFIX}*")) == sorted(Path(src).name for _, src in figures)
    for _, src in figures:
        with Image.open(page.parent / src) as image:
            assert image.format == "PNG" and image.width > 300 and image.height > 150
    accuracy = cells_of(section(text, "table", "data-metric", "attack/tbi/accuracy"))
    assert accuracy == [["fedmd", "0.1 [-1.17, 1.37]", "0 [0, 0]"]]  # fedavg, where tbi never applies, is left out
    na, value = Shown(word="n/a", reason="skipped"), Shown(0.3)
    assert applicable_columns(["none", "mid", "topk"], [[value, na, na], [value, na, value]]) == (
        ["none", "topk"],
        [[value, na], [value, value]],
    )  # a defense column n/a in every row is left out too, one n/a in some rows stays
    assert "No headline metric" in text.split("<h3>Attack gmi</h3>", 1)[1].split("<h3>", 1)[0]  # gmi ran nowhere: no heatmap
    upload = cells_of(section(text, "table", "data-metric", "comm/upload_bytes"))
    assert upload[0][1] == "107,720 [105,179, 110,261]"  # utility as tables too
    assert (page.parent / "plots" / "tradeoff__digits__fedmd.png").is_file()  # fedavg: no attack ran, no plot
    assert "digits · fedavg: no attack metric" in text


def test_na_reasons_are_on_the_cells_and_in_the_not_run_list(page: Path, tmp_path: Path) -> None:
    """A row where the attack applies somewhere keeps its n/a cells with their reasons on hover; every reason is in the
    not-run list, folded away below the answer and the heatmaps."""
    matrix = copy.deepcopy(sample_matrix())  # its cells share FEDAVG_NA
    fedavg_none = next(c for c in matrix["cells"] if c["id"] == "digits/fedavg/none")
    fedavg_none["metrics"]["attack/tbi/accuracy"] = metric(0.3, 0.1, 0.5, 0.2, 0.4)  # tbi now ran in one fedavg cell
    del fedavg_none["not_applicable"]["tbi"]
    mixed = write_matrix_page(matrix, tmp_path / "mixed").read_text()
    accuracy = section(mixed, "table", "data-metric", "attack/tbi/accuracy")
    assert [row[0] for row in cells_of(accuracy)] == ["fedmd", "fedavg"]
    assert f"<td class='off' title='{html.escape(NO_LAPLACE)}'>n/a</td>" in accuracy  # hover gives the whole cell's reason
    text = page.read_text()
    assert "<details><summary>6 cell(s) or attack(s) that did not run" in text
    listed = cells_of(section(text, "table", "class", "not-run"))
    assert listed == [
        ["digits/fedmd/none", "gmi", "n/a", html.escape(NO_WEIGHTS)],
        ["digits/fedmd/laplace", "gmi", "n/a", html.escape(NO_WEIGHTS)],
        *(["digits/fedavg/none", attack, "n/a", html.escape(reason)] for attack, reason in FEDAVG_NA.items()),
        ["digits/fedavg/laplace", "whole cell", "n/a", html.escape(NO_LAPLACE)],
    ]
    assert "'" not in "".join(re.findall(r"title='([^']*)'", text))  # apostrophes in reasons are escaped


def test_missing_intervals_and_values_and_empty_headlines_do_not_break_the_page(tmp_path: Path) -> None:
    matrix = sample_matrix()
    fedmd = matrix["cells"][0]["metrics"]
    fedmd["attack/tbi/accuracy"] = metric(0.4, None, None, 0.4)  # one seed: null interval
    fedmd["attack/tbi/eval_top1"] = metric(None, None, None, None, 0.0)  # a NaN mean is written as null
    matrix["cells"][2]["status"], matrix["cells"][2]["reason"] = "failed", "seed 1: <CUDA> out of memory & more"
    page = write_matrix_page(matrix, tmp_path / "page").read_text()
    assert "[nan" not in page and "nan]" not in page
    assert cells_of(section(page, "table", "data-metric", "attack/ldia/kl"))[0] == [
        "fedmd",
        "0.236 [-0.418, 0.89]",
        "0.361",
    ]  # NaN interval
    assert cells_of(section(page, "table", "data-metric", "attack/tbi/accuracy"))[0][1] == "0.4"
    assert cells_of(section(page, "table", "data-metric", "attack/tbi/eval_top1"))[0][1] == "nan"
    assert "title='seed 1: &lt;CUDA&gt; out of memory &amp; more'>failed</td>" in page

    empty = {**sample_matrix(), "headline": {"tbi": [], "ldia": [], "gmi": []}}
    page = write_matrix_page(empty, tmp_path / "empty").read_text()
    assert "<figure class='heatmap'" not in page and page.count("No headline metric") == 3 and "id='not-run'" in page


def test_an_attack_that_is_na_in_every_cell_of_a_dataset_gets_its_reasons_not_a_heatmap(tmp_path: Path) -> None:
    """gmi with a headline metric (it ran on another dataset) but n/a in all four digits cells: no empty heatmap, the
    distinct reasons once each."""
    matrix = {**sample_matrix(), "headline": {"tbi": HEADLINE[:2], "ldia": HEADLINE[2:], "gmi": ["attack/gmi/eval_top1"]}}
    page = write_matrix_page(matrix, tmp_path / "page").read_text()
    gmi = page.split("<h3>Attack gmi</h3>", 1)[1].split("<h3>", 1)[0]
    assert "<figure" not in gmi and "n/a in every cell of digits" in gmi
    assert re.findall(r"<li>(.*?)</li>", gmi) == [html.escape(r) for r in (NO_WEIGHTS, FEDAVG_NA["gmi"], NO_LAPLACE)]
    assert not list((tmp_path / "page" / "plots").glob(f"{HEATMAP_PREFIX}*gmi*"))
    assert len(re.findall(r"<figure class='heatmap'", page)) == len(HEADLINE)


def test_a_defense_given_at_several_strengths_is_a_path_along_its_strengths(tmp_path: Path) -> None:
    """The curve of laplace at scales 2, 0.5 and 1 (the file's order) joins its points in that order, leaving out the
    strength whose cell has no number; a curve with one point left draws no line; the page still renders."""
    matrix = sample_matrix()
    fedmd = [c for c in matrix["cells"] if c["protocol"] == "fedmd"]
    none, laplace = fedmd
    strengths = {"laplace_2": 0.0, "laplace_0.5": 0.4, "laplace_1": None}
    matrix["cells"] = [none]
    for name, accuracy in strengths.items():
        defended = copy.deepcopy(laplace)
        defended.update(id=f"digits/fedmd/{name}", defense=name)
        if accuracy is None:
            defended["metrics"]["attack/tbi/accuracy"] = metric(math.nan, None, None)
        else:
            defended["metrics"]["attack/tbi/accuracy"] = metric(accuracy, accuracy, accuracy, accuracy, accuracy)
        matrix["cells"].append(defended)
    matrix["axes"]["protocols"], matrix["axes"]["defenses"] = ["fedmd"], ["none", *strengths]
    matrix["curves"] = {
        "laplace": {"key": "defense.laplace.scale", "settings": [["laplace_2", 2.0], ["laplace_0.5", 0.5], ["laplace_1", 1.0]]},
        "topk": {"key": "defense.topk.k", "settings": [["laplace_1", 1.0], ["none", 0.0]]},  # one point with a number
    }
    points = tradeoff_points(matrix, "digits", "fedmd", "attack/tbi/accuracy")
    assert [p.name for p in points] == ["none", "laplace_2", "laplace_0.5"]
    paths = curve_paths(points, matrix["curves"])
    assert list(paths) == ["laplace"] and [p.name for p in paths["laplace"]] == ["laplace_2", "laplace_0.5"]
    assert write_matrix_page(matrix, tmp_path / "page").is_file()


def test_a_second_write_replaces_the_page_whole(tmp_path: Path) -> None:
    out = tmp_path / "page"
    write_matrix_page(sample_matrix(), out)
    (out / "notes.txt").write_text("mine")
    other = copy.deepcopy(sample_matrix())
    other.update(name="other", source="other.yaml", headline={"tbi": HEADLINE[:1], "ldia": [], "gmi": []})
    other["axes"]["data"] = ["mnist"]
    for c in other["cells"]:
        c["data"], c["id"] = "mnist", c["id"].replace("digits", "mnist")
    write_matrix_page(other, out)
    text = (out / "index.html").read_text()
    assert "Leakage matrix other" in text and "tiny" not in text
    assert sorted(p.name for p in (out / "plots").iterdir()) == ["heatmap__mnist__attack-tbi-accuracy.png", "tradeoff__mnist__fedmd.png"]
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "notes.txt", "plots"]  # no staging left behind


def test_a_file_in_the_way_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "page").mkdir()
    (tmp_path / "page" / "plots").write_text("mine")
    with pytest.raises(ConfigError, match="plots is in the way"):
        write_matrix_page(sample_matrix(), tmp_path / "page")
    assert sorted(p.name for p in (tmp_path / "page").iterdir()) == ["plots"] and (tmp_path / "page" / "plots").read_text() == "mine"


# ----------------------------------------------------------------------------------------------- in Chromium
@pytest.mark.parametrize("width", [1400, 800])
def test_the_page_renders_in_headless_chromium(page: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, width: int) -> None:
    png = tmp_path / f"matrix_{width}.png"
    proc = chromium(page.as_uri(), [f"--screenshot={png}", f"--window-size={width},2000"], tmp_path, tmp_path_factory.mktemp("cr"))
    assert proc.returncode == 0 and png.is_file(), proc.stderr[-2000:]
    pixels = np.asarray(Image.open(png).convert("L"), dtype=np.float64)
    assert pixels.shape == (2000, width)
    assert (pixels < 200).mean() > 0.03 and pixels.std() > 20  # text, tables and heatmaps, not a blank page


def test_the_heatmaps_load_in_headless_chromium(page: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A copy of the page beside it reports each image's natural width once loaded (0: broken)."""
    probe = page.with_name("probe.html")
    widths = "[...document.images].map(i=>i.src.split('/').pop()+'='+i.naturalWidth).join(' ')"
    script = f"<script>addEventListener('load',()=>{{document.body.dataset.widths={widths}}})</script>"
    probe.write_text(page.read_text() + script)
    try:
        proc = chromium(probe.as_uri(), ["--virtual-time-budget=10000", "--dump-dom"], tmp_path, tmp_path_factory.mktemp("cr"))
    finally:
        probe.unlink()
    assert proc.returncode == 0, proc.stderr[-2000:]
    match = re.search(r'data-widths="([^"]*)"', proc.stdout)
    assert match, proc.stdout[-2000:]
    widths = dict(item.rsplit("=", 1) for item in match.group(1).split())
    heatmaps = {name: int(w) for name, w in widths.items() if name.startswith(HEATMAP_PREFIX)}
    assert len(heatmaps) == len(HEADLINE) and all(int(w) > 0 for w in widths.values()), widths


# ------------------------------------------------------------------------------------------------------ W&B
def test_matrix_rows_have_every_metric_and_every_reason() -> None:
    rows = [dict(zip(MATRIX_COLUMNS, row)) for row in matrix_rows(sample_matrix())]
    reasons = [(r["protocol"], r["defense"], r["attack"], r["status"], r["reason"]) for r in rows if not r["metric"]]
    assert reasons == [
        ("fedmd", "none", "gmi", "n/a", NO_WEIGHTS),
        ("fedmd", "laplace", "gmi", "n/a", NO_WEIGHTS),
        *(("fedavg", "none", attack, "n/a", reason) for attack, reason in FEDAVG_NA.items()),
        ("fedavg", "laplace", "", "n/a", NO_LAPLACE),
    ]
    metrics = {(r["protocol"], r["defense"], r["metric"]): r for r in rows if r["metric"]}
    assert len(metrics) == 2 * (3 + 4) + 3  # fedmd: 3 headline + 4 utility per defense; fedavg/none: 3 utility
    assert "attack/tbi/chance" not in {m for _, _, m in metrics}  # neither headline nor utility
    kl = metrics["fedmd", "laplace", "attack/ldia/kl"]
    assert (kl["attack"], kl["mean"], kl["ci_low"], kl["ci_high"], kl["seeds"], kl["status"]) == ("ldia", 0.3612, None, None, 2, "done")
    assert metrics["fedmd", "none", "protocol/client_acc_mean"]["attack"] == ""


def test_the_wandb_summary_offline_logs_the_table_and_the_heatmaps(page: Path, tmp_path: Path) -> None:
    plots = sorted((page.parent / "plots").glob(f"{HEATMAP_PREFIX}*.png"))
    directory = log_matrix_summary(WandbConfig(mode="offline", tags=["nightly"]), tmp_path, sample_matrix(), plots)
    assert directory is not None and directory.parent == tmp_path / "wandb"
    records = finished_records(tmp_path)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.job_type, list(run.tags)) == (
        "tiny-summary",
        "tiny",
        MATRIX_JOB_TYPE,
        ["matrix", "nightly"],
    )
    (table_file,) = (directory / "files" / "media" / "table").glob("matrix_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == list(MATRIX_COLUMNS)
    assert table["data"] == json.loads(json.dumps(matrix_rows(sample_matrix())))
    images = sorted(p.name.split("_0_")[0] for p in (directory / "files" / "media" / "images" / "matrix").glob("*.png"))
    assert images == sorted(p.stem for p in plots) and len(images) == len(HEADLINE)
    (history,) = [r.history for r in records if r.WhichOneof("record_type") == "history"]  # one step
    types = {item.nested_key[0]: json.loads(item.value_json) for item in history.item if list(item.nested_key[1:]) == ["_type"]}
    assert types == {"matrix": "table-file", **{f"matrix/{p.stem}": "image-file" for p in plots}}


def test_the_wandb_summary_disabled_writes_nothing(tmp_path: Path) -> None:
    assert log_matrix_summary(WandbConfig(mode="disabled"), tmp_path / "root", sample_matrix(), []) is None
    assert not (tmp_path / "root").exists()


# ------------------------------------------------------------------------------------------- the answer it leads with
def _answer_matrix() -> dict[str, Any]:
    """fedmd: TBI at 0.5 [0.4, 0.6] undefended (chance 0.2), LDIA's KL 0.2 [0.1, 0.3] (uniform guess 0.5); three
    defense settings at their own accuracy cost."""
    settings = {  # defense: (clients' accuracy, TBI accuracy interval, LDIA KL interval)
        "none": (0.80, (0.4, 0.6), (0.1, 0.3)),
        "laplace_1": (0.75, (0.1, 0.3), (0.2, 0.45)),
        "laplace_2": (0.60, (0.0, 0.1), (0.4, 0.6)),
        "topk_1": (0.70, (0.35, 0.55), (0.45, 0.7)),
    }
    cells = [
        cell(
            "fedmd",
            defense,
            metrics={
                "protocol/client_acc_mean": metric(acc, acc, acc),
                "attack/tbi/accuracy": metric(sum(tbi) / 2, *tbi, *_three_seeds(tbi)),
                "attack/tbi/chance": metric(0.2, 0.2, 0.2, 0.2, 0.2, 0.2),
                "attack/ldia/kl": metric(sum(kl) / 2, *kl, *_three_seeds(kl)),
                "attack/ldia/uniform_kl": metric(0.5, 0.5, 0.5, 0.5, 0.5, 0.5),
            },
        )
        for defense, (acc, tbi, kl) in settings.items()
    ]
    for c in cells:
        c["seeds"] = [0, 1, 2]
    return {
        "name": "answer",
        "seeds": [0, 1, 2],
        "undefended": "none",
        "axes": {"data": ["digits"], "protocols": ["fedmd"], "defenses": list(settings), "attacks": ["tbi", "ldia"]},
        "headline": {"tbi": ["attack/tbi/accuracy"], "ldia": ["attack/ldia/kl"]},
        "utility": ["protocol/client_acc_mean"],
        "cells": cells,
    }


def _three_seeds(interval: tuple[float, float]) -> tuple[float, float, float]:
    """Per-seed values spread a quarter of the interval's width around its middle."""
    middle, quarter = sum(interval) / 2, (interval[1] - interval[0]) / 4
    return middle - quarter, middle, middle + quarter


@pytest.fixture(scope="module")
def answer_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The page of :func:`_answer_matrix`, as text."""
    return write_matrix_page(_answer_matrix(), tmp_path_factory.mktemp("answer") / "page").read_text()


def test_the_page_leads_with_where_each_attack_leaks_and_the_cheapest_defense_that_stops_it(answer_page: str) -> None:
    """TBI leaks (0.4 > chance 0.2); of the settings that no longer leak seed by seed, laplace_1 (its seeds around
    chance) costs 0.05 of accuracy and laplace_2 (below chance) 0.20: laplace_1; topk_1 still leaks. LDIA's KL leaks
    below the uniform guess (0.3 < 0.5); under laplace_1 it is still below it at every seed; of the two that are not,
    topk_1 (cost 0.10) is cheaper than laplace_2 (0.20)."""
    found = {a.attack: a for a in answers(_answer_matrix())}
    tbi, ldia = found["tbi"], found["ldia"]
    assert tbi.leaks and tbi.baseline == pytest.approx(0.2) and tbi.tried == 3
    assert tbi.cheapest is not None and tbi.cheapest.defense == "laplace_1" and tbi.cheapest.cost == pytest.approx(0.05)
    assert ldia.leaks and ldia.baseline == 0.5 and ldia.cheapest is not None and ldia.cheapest.defense == "topk_1"
    assert ldia.cheapest.cost == pytest.approx(0.10)
    page = answer_page
    answer = section(page, "table", "class", "answer")
    assert page.index("id='answer'") < page.index("Data digits")
    assert [row[0] for row in cells_of(answer)] == ["tbi", "ldia"]
    assert "laplace_1" in cells_of(answer)[0][-1] and "-0.05" not in cells_of(answer)[0][-1]


def test_an_attack_no_setting_stops_is_said_so_and_one_within_its_baseline_does_not_leak() -> None:
    matrix = _answer_matrix()
    for c in matrix["cells"]:
        if c["defense"] != "none":
            c["metrics"]["attack/tbi/accuracy"] = metric(0.5, 0.45, 0.55, 0.45, 0.5, 0.55)
        else:
            c["metrics"]["attack/ldia/kl"] = metric(0.45, 0.3, 0.6, 0.3, 0.45, 0.6)  # holds the uniform guess: no leak
    found = {a.attack: a for a in answers(matrix)}
    assert found["tbi"].leaks and found["tbi"].cheapest is None and found["tbi"].tried == 3
    assert not found["ldia"].leaks
    assert baseline_of(None, "attack/lira_distill/auc") == 0.5 and baseline_of(None, "attack/pli/ssim") is None


def test_a_leak_is_the_per_seed_difference_from_that_seeds_baseline() -> None:
    """LDIA's uniform guess differs by seed (the seed draws the clients' label mixes). KL 0.30 / 0.40 / 0.50 against
    uniform guesses 0.35 / 0.45 / 0.55: below it by 0.05 at every seed, with each seed's own within-run sd 0.01 and
    δ = 0.01, a leak, though the KL's own interval over the seeds holds the guesses' mean; the guesses the other way
    round (0.25 / 0.35 / 0.45): above at every seed, within δ. Without the seeds' own spread a constant difference has
    nothing to scale a test by: unknown, neither a certain leak nor a stop."""
    matrix = _answer_matrix()
    matrix["margins"] = {"kl": 0.01}
    none = next(c for c in matrix["cells"] if c["defense"] == "none")
    none["metrics"]["attack/ldia/kl"] = {**metric(0.4, 0.15, 0.65, 0.30, 0.40, 0.50), "within": [1e-4] * 3}
    none["metrics"]["attack/ldia/uniform_kl"] = metric(0.45, 0.3, 0.6, 0.35, 0.45, 0.55)
    ldia = next(a for a in answers(matrix) if a.attack == "ldia")
    assert ldia.leaks and ldia.decision.mean == pytest.approx(0.05)  # on the leaky side: the guess's KL less the attack's
    assert ldia.decision.low == pytest.approx(0.05 - T2 * 0.01 / math.sqrt(3))
    none["metrics"]["attack/ldia/uniform_kl"] = metric(0.35, 0.2, 0.5, 0.25, 0.35, 0.45)
    ldia = next(a for a in answers(matrix) if a.attack == "ldia")
    assert ldia.decision.verdict is Verdict.stopped and ldia.decision.mean == pytest.approx(-0.05)
    del none["metrics"]["attack/ldia/kl"]["within"]
    assert next(a for a in answers(matrix) if a.attack == "ldia").decision.verdict is Verdict.unknown


def test_the_control_is_the_attackers_best_without_the_protocol_seed_by_seed() -> None:
    """TBI at 0.40 / 0.50 / 0.60 against chance 0.2 leaks; PLI's learned prior at 0.45 / 0.55 / 0.50 and the public look
    at 0.50 / 0.45 / 0.65 make the control their seed-by-seed best, 0.50 / 0.55 / 0.65, and TBI falls below it: no
    leak is shown. A control run's value counts the same way; a cell with one seed is unknown, never a stop."""
    matrix = _answer_matrix()
    none = next(c for c in matrix["cells"] if c["defense"] == "none")
    none["metrics"]["attack/pli/prior_accuracy"] = {**metric(0.5, 0.4, 0.6, 0.45, 0.55, 0.50), "within": [4e-3] * 3}
    none["metrics"]["attack/public_mean/accuracy"] = metric(0.53, 0.4, 0.7, 0.50, 0.45, 0.65)
    tbi = next(a for a in answers(matrix) if a.attack == "tbi")
    assert [v for v, _ in tbi.control.values.values()] == [0.50, 0.55, 0.65] and tbi.baseline == pytest.approx(1.7 / 3)
    assert set(tbi.control.sources) == {"chance", "pli/prior_accuracy", "public_mean/accuracy"}
    assert not tbi.leaks and tbi.decision.mean == pytest.approx(0.5 - 1.7 / 3)
    assert "public_mean" not in {a.attack for a in answers(matrix)}  # the public look is a control, not an attack
    del none["metrics"]["attack/pli/prior_accuracy"], none["metrics"]["attack/public_mean/accuracy"]
    matrix["axes"]["defenses"].append("control")
    control = {**none, "id": "digits/fedmd/control", "defense": "control", "metrics": dict(none["metrics"])}
    control["metrics"]["attack/tbi/accuracy"] = metric(0.45, 0.3, 0.6, 0.35, 0.45, 0.55)
    matrix["cells"].append(control)
    tbi = next(a for a in answers(matrix) if a.attack == "tbi")
    assert [v for v, _ in tbi.control.values.values()] == [0.35, 0.45, 0.55] and "the control run" in tbi.control.sources
    assert "control" not in {s.defense for s in tbi.settings}  # the control run is no defense
    laplace = next(c for c in matrix["cells"] if c["defense"] == "laplace_1")
    laplace["seeds"] = [0]
    laplace["metrics"]["attack/tbi/accuracy"] = metric(0.05, None, None, 0.05)
    one = next(s for s in next(a for a in answers(matrix) if a.attack == "tbi").settings if s.defense == "laplace_1")
    assert one.decision.verdict is Verdict.unknown and not one.stops


def test_each_defense_curve_gets_its_cheapest_stop_and_a_value_at_chance_is_not_a_leak() -> None:
    """With laplace_1 and laplace_2 one curve, TBI's answer names laplace_1 for it and none for topk_1 (still above
    chance); LDIA's names topk_1 and laplace_2 (laplace_1 still below the guess). A defended value stored from float32
    (0.2000000029802322) at chance 0.2 at every seed, each seed with the spread of 4 hits in 20 targets, is shown within
    δ = one chance level of it: it stops the attack; without the seeds' own spread it is unknown."""
    matrix = _answer_matrix()
    matrix["curves"] = {"laplace": {"key": "defense.laplace.scale", "settings": [["laplace_1", 1.0], ["laplace_2", 2.0]]}}
    found = {a.attack: a for a in answers(matrix)}
    assert {d: s and s.defense for d, s in found["tbi"].by_defense.items()} == {"laplace": "laplace_1", "topk_1": None}
    assert {d: s and s.defense for d, s in found["ldia"].by_defense.items()} == {"laplace": "laplace_2", "topk_1": "topk_1"}
    assert per_defense(found["tbi"]) == "laplace: laplace_1 (+0.05); topk_1: no stop (1 leaks)"
    topk = next(c for c in matrix["cells"] if c["defense"] == "topk_1")
    at_chance = 0.2000000029802322
    topk["metrics"]["attack/tbi/accuracy"] = metric(at_chance, at_chance, at_chance, at_chance, at_chance, at_chance)
    assert next(a for a in answers(matrix) if a.attack == "tbi").by_defense["topk_1"] is None
    topk["metrics"]["attack/tbi/accuracy"]["within"] = [within_variance(*wilson_interval(4, 20))] * 3
    assert next(a for a in answers(matrix) if a.attack == "tbi").by_defense["topk_1"] is not None


def test_one_sentence_per_attack_names_the_cheapest_stopping_setting_and_its_cost(answer_page: str) -> None:
    (tbi, ldia) = re.findall(r"<li>(.*?)</li>", section(answer_page, "ul", "class", "sentences"))
    assert html.unescape(tbi) == (
        "tbi leaks beyond its control at 1 of 1 place(s) undefended, most at digits / fedmd (0.5 against its control's 0.2); "
        "the cheapest setting shown to stop it there is laplace_1 (0.2 [0.1, 0.3], an accuracy cost of 0.05); a setting is "
        "shown to stop it at 1 of the 1 leaking place(s)."
    )
    assert (
        ldia.startswith("ldia leaks beyond its control at 1 of 1") and "stop it there is topk_1" in ldia and "accuracy cost of 0.1" in ldia
    )
    matrix = _answer_matrix()
    for c in matrix["cells"]:
        c["metrics"]["attack/tbi/accuracy"] = metric(0.2, 0.1, 0.3, 0.1, 0.2, 0.3)
    assert sentence("tbi", [a for a in answers(matrix) if a.attack == "tbi"]).startswith(
        "tbi is shown to leak beyond its control at none of the 1 place(s) it was measured undefended (1 no leak beyond δ;"
    )


def test_the_images_of_each_leak_are_shown_beside_its_score(tmp_path: Path) -> None:
    """TBI leaks undefended and its cell saved images: the page copies the first seed's and captions it with the score;
    LDIA leaks too but saved none, and a cell whose image went missing shows nothing rather than a broken link."""
    matrix = _answer_matrix()
    none = next(c for c in matrix["cells"] if c["defense"] == "none")
    saved = "digits/fedmd/none/seed_0/images/attack_tbi_reconstructions_round_0002.png"
    none["images"] = {"tbi": [saved, saved.replace("seed_0", "seed_1")]}
    (tmp_path / saved).parent.mkdir(parents=True)
    (tmp_path / saved).write_bytes(b"\x89PNG tbi")
    page = write_matrix_page(matrix, tmp_path / "page", images_from=tmp_path)
    (figure,) = re.findall(r"<div class='gallery'>(.*?)</div>", page.read_text(), flags=re.DOTALL)
    assert figure.count("<figure>") == 1 and "tbi, digits / fedmd, seed 0: 0.5 [0.4, 0.6] against its control's 0.2" in html.unescape(
        figure
    )
    assert (tmp_path / "page" / "plots" / "answer__tbi__digits__fedmd.png").read_bytes() == b"\x89PNG tbi"
    (tmp_path / saved).unlink()
    assert "class='gallery'" not in write_matrix_page(matrix, tmp_path / "page", images_from=tmp_path).read_text()


def test_heatmap_colours_are_centred_on_the_baseline_and_a_cell_that_holds_it_is_marked(answer_page: str) -> None:
    """Chance 0.2 with cells at 0.5 and 0.0: the scale runs 0.2 ± 0.3, so 0.2 is the centre (white) and 0.5 and -0.1 the
    ends; without a baseline, rates keep [0, 1]. A cell whose interval holds the baseline says so; the caption names it."""
    assert colour_scale([0.5, 0.0], 0.2) == pytest.approx((-0.1, 0.2, 0.5))
    assert colour_scale([0.2], 0.2) == (-0.3, 0.2, 0.7)  # all at the baseline: a scale of ±0.5 around it
    assert colour_scale([0.5, 0.0], None) == (0.0, None, 1.0)
    assert holds(Shown(0.3, 0.1, 0.5), 0.2) and not holds(Shown(0.5, 0.4, 0.6), 0.2) and not holds(Shown(0.3), 0.2)
    page = answer_page
    figure = section(page, "figure", "data-metric", "attack/tbi/accuracy")
    assert "white = the baseline 0.2" in figure
    assert "white = the baseline 0.5" in section(page, "figure", "data-metric", "attack/ldia/kl")
