"""``fdattack report`` compares runs: labels by differing config keys, chance lines, per-attack tables, one-off
metrics, labeled grids; and the page renders in headless Chromium at 1400 and 800 px."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from fdattack.cli import main
from fdattack.tracking import attack_summary
from fdattack.tracking.report_runs import load_runs
from tests.conftest import REPO, tiny
from tests.report_runs import TARGETS, fake_run

LABELS = ["tau=1, gamma=0", "tau=3, gamma=0.1", "tau=3, gamma=0.5"]
INSTALL = "apt-get update && apt-get install -y chromium"


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of three fake trials of a tau/gamma sweep; returns its index.html."""
    base = tmp_path_factory.mktemp("sweep")
    runs = [fake_run(base / f"trial_{i:03d}", tau, gamma, seed=i) for i, (tau, gamma) in enumerate([(1.0, 0.0), (3.0, 0.1), (3.0, 0.5)])]
    assert main(["report", *map(str, runs), "--out", str(base / "report")]) == 0
    return base / "report" / "index.html"


def run_labels(table_html: str) -> list[str]:
    """The run labels of a table's rows."""
    return re.findall(r"<td class='run'><span class='swatch'[^>]*></span>([^<]*)</td>", table_html)


def table(page: str, css: str) -> str:
    match = re.search(rf"<table class='{re.escape(css)}'>.*?</table>", page, flags=re.DOTALL)
    assert match, f"no table {css!r}"
    return match.group(0)


def test_runs_are_labeled_by_the_config_keys_in_which_they_differ(sweep_report: Path) -> None:
    page = sweep_report.read_text()
    assert run_labels(table(page, "runs")) == LABELS  # not trial_000 ...: name, output_dir and logger.* are ignored
    assert "attack.pli.tau, attack.pli.gamma." in page


def test_a_final_table_per_attack_with_a_row_per_run(sweep_report: Path) -> None:
    page = sweep_report.read_text()
    pli = table(page, "final section-attack/pli")
    assert run_labels(pli) == LABELS
    heads = re.findall(r"<th[^>]*>(.*?)</th>", pli.replace("<wbr>", ""))
    assert heads == ["run", "accuracy", "SSIM", "eval top-1", "chance"]  # the one-off prior scores are not here
    assert "<td>0.875</td>" in pli and pli.count("<td>0.2</td>") == 3
    assert run_labels(table(page, "final section-attack/tbi")) == LABELS
    assert run_labels(table(page, "final section-protocol")) == LABELS


def test_accuracy_plots_carry_the_chance_line_and_legends_name_every_run(sweep_report: Path) -> None:
    page, plots = sweep_report.read_text(), sweep_report.parent / "plots"
    assert "<figure data-metric='attack/pli/accuracy' data-chance='1'>" in page
    assert "<figure data-metric='attack/pli/ssim' data-chance='0'>" in page
    accuracy = (plots / "attack_pli__accuracy.svg").read_text()
    assert 'id="chance0"' in accuracy and "chance = 0.2" in accuracy
    assert all(label in accuracy for label in LABELS)
    assert 'id="chance0"' not in (plots / "attack_pli__ssim.svg").read_text()
    assert not (plots / "attack_pli__chance.svg").exists()


def test_one_off_metrics_are_a_table_not_a_one_point_plot(sweep_report: Path) -> None:
    page = sweep_report.read_text()
    one_off = table(page, "oneoff section-attack/pli")
    assert run_labels(one_off) == LABELS and "prior_<wbr>accuracy" in one_off and one_off.count("<td>0.45</td>") == 3
    assert not list((sweep_report.parent / "plots").glob("*prior*"))
    assert "transfer_<wbr>public_<wbr>loss" in table(page, "oneoff section-protocol")  # round 0 only


def test_reconstruction_grids_are_large_with_row_and_column_labels(sweep_report: Path) -> None:
    page = sweep_report.read_text()
    pli = page.split("<section id='attack/pli'>", 1)[1].split("</section>", 1)[0]
    assert pli.count("<div class='head'>reconstruction</div>") == 3 and pli.count("<div class='head'>private mean</div>") == 6
    assert all(pli.count(f"label {t}</div>") == 3 for t in TARGETS)  # row labels read from the artifacts
    assert "grids/run1_attack_pli_reconstructions_round_0003.png" in pli  # each run's latest round
    assert "<div class='head'>prior</div>" in pli and "grids/run3_attack_pli_prior_round_0001.png" in pli
    sizes = {int(w) for w in re.findall(r"class='tile' style='width:(\d+)px", pli)}
    assert min(sizes) >= 64  # 8 px tiles shown at 12x, pixelated
    assert (sweep_report.parent / "grids" / "run2_attack_pli_reconstructions_round_0003.png").is_file()


@pytest.mark.parametrize("width", [1400, 800])
def test_the_report_renders_in_headless_chromium(
    sweep_report: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, width: int
) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail(f"chromium is not installed; the report's rendering test needs it: {INSTALL}")
    png = tmp_path / f"report_{width}.png"
    short = tmp_path_factory.mktemp("cr")  # chromium's singleton socket lives in TMPDIR: its path must stay under 108 bytes
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "TMPDIR": str(short),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    proc = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={png}",
            f"--window-size={width},2000",
            sweep_report.as_uri(),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and png.is_file(), proc.stderr[-2000:]
    pixels = np.asarray(Image.open(png).convert("L"), dtype=np.float64)
    assert pixels.shape == (2000, width)
    assert (pixels < 200).mean() > 0.03 and pixels.std() > 20  # text, tables and plots, not a blank page


def test_report_of_a_real_run(tmp_path: Path) -> None:
    experiment = str(REPO / "conf" / "experiment" / "fedmd_digits.yaml")
    assert main(["run", experiment, *tiny(tmp_path, "attacks=[public_mean]", "evaluation.epochs=2")]) == 0  # scores not asserted
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert run_labels(table(page, "final section-attack/public_mean")) == ["fedmd_digits"]  # no other run to differ from
    assert "<figure data-metric='attack/public_mean/accuracy' data-chance='1'>" in page
    assert re.search(r"<div class='rowhead'>label \d+</div>", page) and "<div class='head'>public mean</div>" in page
    assert (tmp_path / "report" / "plots" / "protocol__client_acc_mean.svg").is_file()


def test_labels_name_a_differing_component_and_tell_clashing_keys_apart(tmp_path: Path) -> None:
    def run(name: str, config: dict) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "rounds.jsonl").write_text("")
        OmegaConf.save(OmegaConf.create(config), tmp_path / name / "config.yaml")
        return tmp_path / name

    fedmd = run("a", {"name": "x", "protocol": {"name": "fedmd", "digest_epochs": 1}, "attack": {"pli": {"tau": 1}, "tbi": {"tau": 1}}})
    dsfl = run("b", {"name": "y", "protocol": {"name": "dsfl", "era_temperature": 0.1}, "attack": {"pli": {"tau": 2}, "tbi": {"tau": 3}}})
    runs, keys = load_runs([fedmd, dsfl])
    assert [r.label for r in runs] == ["protocol=fedmd, pli.tau=1, tbi.tau=1", "protocol=dsfl, pli.tau=2, tbi.tau=3"]
    assert "protocol.era_temperature" in keys
    twins, _ = load_runs(
        [
            fedmd,
            run("c", {"name": "x", "protocol": {"name": "fedmd", "digest_epochs": 1}, "attack": {"pli": {"tau": 1}, "tbi": {"tau": 1}}}),
        ]
    )
    assert [r.label for r in twins] == ["x (a)", "x (c)"]


def test_report_on_a_non_run_folder_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "rounds.jsonl" in capsys.readouterr().err


def test_report_on_a_corrupt_config_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rounds.jsonl").write_text("")
    (tmp_path / "config.yaml").write_text("a: [unclosed\n")
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "config.yaml" in err and not (tmp_path / "r").exists()


def test_attack_summary_has_a_row_per_attack_with_its_final_scores() -> None:
    final = {
        "attack/tbi/accuracy": 0.25,
        "attack/pli/accuracy": 0.8,
        "attack/pli/ssim": 0.7123,
        "attack/pli/chance": 0.2,
        "attack/pli/too_close_to_public": 1.0,
        "protocol/client_acc_mean": 0.9,
        "attack/pli/prior/extra": 1.0,
    }
    lines = attack_summary(final).splitlines()
    assert lines[0].split()[:3] == ["attack", "accuracy", "SSIM"]
    assert lines[1].split() == ["pli", "0.80", "0.712", "1", "-", "0.20"]
    assert lines[2].split() == ["tbi", "0.25", "-", "-", "-", "-"]
    assert len({len(line) for line in lines}) == 1  # columns line up
    assert attack_summary({"protocol/client_acc_mean": 0.9}) == ""
