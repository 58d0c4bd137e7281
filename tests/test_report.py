"""``fdattack report`` compares runs: labels by differing config keys, chance lines, per-attack tables, one-off
metrics, labeled grids; the page renders in headless Chromium at 1400 and 800 px; and a bad run directory or --out
is one line, exit status 2, with --out left as it was."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from fdattack.cli import main
from fdattack.report.runs import load_runs
from fdattack.tracking import attack_summary
from tests.conftest import REPO, error_of, own_messages, tiny
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


def chromium(url: str, args: list[str], tmp_path: Path, short: Path) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``url`` with the flags and environment every rendering test uses, plus ``args``;
    fails (never skips) where chromium is missing."""
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail(f"chromium is not installed; the rendering tests need it: {INSTALL}")
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "TMPDIR": str(short),  # chromium's singleton socket lives in TMPDIR: its path must stay under 108 bytes
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    flags = [
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
    ]
    return subprocess.run([binary, *flags, *args, url], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("width", [1400, 800])
def test_the_report_renders_in_headless_chromium(
    sweep_report: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, width: int
) -> None:
    png = tmp_path / f"report_{width}.png"
    short = tmp_path_factory.mktemp("cr")  # chromium's singleton socket lives in TMPDIR: its path must stay under 108 bytes
    proc = chromium(sweep_report.as_uri(), [f"--screenshot={png}", f"--window-size={width},2000"], tmp_path, short)
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


ROUNDS = '{"round": 1, "attack/pli/accuracy": 0.5}\n{"round": 2, "attack/pli/accuracy": 0.6, "attack/pli/chance": 0.2}\n'
#: A run directory and an earlier report in --out (paths under tmp_path); a case's files replace these, None deletes.
EARLIER: dict[str, str | bytes | None] = {
    "run/rounds.jsonl": ROUNDS,
    "run/metrics.json": '{"attack/pli/accuracy": 0.6, "attack/pli/chance": 0.2}',
    "report/index.html": "an earlier report",
    "report/notes.txt": "notes of mine",
}
GRID = "run/images/attack_pli_reconstructions_round_0002.png"


def _png_header(width: int, height: int) -> bytes:
    """The start of a grayscale PNG of ``width`` x ``height``: its signature, header chunk and an empty data chunk."""
    chunks = [b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0), b"IDAT"]
    return b"\x89PNG\r\n\x1a\n" + b"".join(struct.pack(">I", len(c) - 4) + c + struct.pack(">I", zlib.crc32(c)) for c in chunks)


def _write(root: Path, files: dict[str, str | bytes | None]) -> None:
    """Write ``{**EARLIER, **files}`` under ``root``."""
    for name, content in {**EARLIER, **files}.items():
        if content is not None:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(content if isinstance(content, bytes) else content.encode())


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder)."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def _refused(capsys: pytest.CaptureFixture[str], root: Path, args: str, where: str, texts: list[str]) -> None:
    """``fdattack report ARGS`` (paths under ``root``) is exit 2 and one line naming ``where`` and ``texts``; nothing under
    ``root`` changed."""
    before = _tree(root)
    argv = [arg if arg.startswith("-") else str(root / arg) for arg in args.split()]
    assert main(["report", *argv]) == 2
    err = error_of(capsys.readouterr().err)
    assert all(text in err for text in [str(root / where), *texts]), err
    assert _tree(root) == before


@pytest.mark.parametrize(
    ("files", "args", "where", "texts"),
    [
        pytest.param(
            {"run/metrics.json": "[0.6]"}, "run --out report", "run/metrics.json", ["a JSON list, not an object"], id="metrics_list"
        ),
        pytest.param(
            {"run/metrics.json": "0.6"}, "run --out report", "run/metrics.json", ["a JSON number, not an object"], id="metrics_scalar"
        ),
        pytest.param({"run/metrics.json": "{oops"}, "run --out report", "run/metrics.json", ["not JSON"], id="metrics_not_json"),
        pytest.param(
            {"run/metrics.json": '{"attack/pli/chance": "low"}'},
            "run --out report",
            "run/metrics.json",
            ['"attack/pli/chance" is "low"', "a number or null"],
            id="metrics_string",
        ),
        pytest.param(
            {"run/metrics.json": '{"attack/pli": {"accuracy": 0.6}}'},
            "run --out report",
            "run/metrics.json",
            ['"attack/pli" is {"accuracy": 0.6}'],
            id="metrics_nested",
        ),
        pytest.param(
            {"run/rounds.jsonl": ROUNDS + "[3]\n"}, "run --out report", "run/rounds.jsonl", ["line 3", "a JSON list"], id="row_list"
        ),
        pytest.param(
            {"run/rounds.jsonl": ROUNDS + '{"attack/pli/accuracy": 0.7}\n'},
            "run --out report",
            "run/rounds.jsonl",
            ["line 3", 'no "round"'],
            id="row_without_round",
        ),
        *(
            pytest.param(
                {"run/rounds.jsonl": f'{{"round": {value}}}\n' + ROUNDS},
                "run --out report",
                "run/rounds.jsonl",
                ["line 1", f'"round" is {value}', "an integer >= 0"],
                id=f"round_{name}",
            )
            for name, value in [("fraction", "1.5"), ("string", '"2"'), ("null", "null"), ("boolean", "true"), ("negative", "-1")]
        ),
        pytest.param(
            {"run/rounds.jsonl": ROUNDS + '{"round": 3, "attack/pli/accuracy": "high"}\n'},
            "run --out report",
            "run/rounds.jsonl",
            ["line 3", '"attack/pli/accuracy" is "high"', "a number or null"],
            id="row_string_metric",
        ),
        pytest.param(
            {"run/rounds.jsonl": '{"round": 1, "attack/pli/acc\n' + ROUNDS},
            "run --out report",
            "run/rounds.jsonl",
            ["line 1", "not JSON"],
            id="row_corrupt_first",
        ),
        pytest.param(  # a newline after it: not a write cut short
            {"run/rounds.jsonl": ROUNDS + '{"round": 3, "attack/pli/acc\n'},
            "run --out report",
            "run/rounds.jsonl",
            ["line 3", "not JSON"],
            id="row_corrupt_last_line_with_newline",
        ),
        pytest.param({}, "nowhere --out report", "nowhere", ["no such run directory"], id="run_missing"),
        pytest.param({}, "run/metrics.json --out report", "run/metrics.json", ["a file, not a run directory"], id="run_is_a_file"),
        pytest.param(
            {"run/rounds.jsonl": None, "run/metrics.json": None, "run/config.yaml": "seed: 1\n"},
            "run --out report",
            "run",
            ["not an fdattack run directory", "neither rounds.jsonl nor metrics.json"],
            id="run_without_record",
        ),
        pytest.param({"run/config.yaml": "a: [unclosed\n"}, "run --out report", "run/config.yaml", ["not a readable config"], id="config"),
        pytest.param({GRID: b"not a png"}, "run --out report", GRID, ["not a readable image"], id="grid_not_an_image"),
        pytest.param({GRID: _png_header(60000, 60000)}, "run --out report", GRID, ["decompression bomb"], id="grid_bomb"),
        pytest.param({}, "run --out report/notes.txt", "report/notes.txt", ["exists and is not a folder"], id="out_is_a_file"),
        pytest.param({}, "run --out report/notes.txt/sub", "report/notes.txt", ["is a file, not a folder"], id="out_under_a_file"),
        pytest.param({"report/plots": "mine"}, "run --out report", "report/plots", ["in the way"], id="out_plots_is_a_file"),
    ],
)
def test_a_bad_run_directory_or_out_is_one_line_and_leaves_out_as_it_was(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, files: dict[str, str | bytes | None], args: str, where: str, texts: list[str]
) -> None:
    _write(tmp_path, files)
    _refused(capsys, tmp_path, args, where, texts)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder; out_under_a_file stands in for it")
def test_out_in_a_read_only_folder_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _write(tmp_path, {})
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked").chmod(0o555)
    try:
        _refused(capsys, tmp_path, "run --out locked/report", "locked", ["not writable"])
    finally:
        (tmp_path / "locked").chmod(0o755)


def test_a_torn_last_round_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A run killed while writing a round leaves its last line cut short (no newline): the rounds before it are reported."""
    _write(tmp_path, {"run/rounds.jsonl": ROUNDS + '{"round": 3, "attack/pli/acc'})
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    assert [m for m in own_messages(caplog) if "torn" in m] == [
        f"{tmp_path / 'run' / 'rounds.jsonl'}, line 3: skipped, not JSON: a round's record torn by a run killed while writing it"
    ]
    assert "<td>2</td><td class='dir'>" in (tmp_path / "report" / "index.html").read_text()  # its last round


@pytest.mark.parametrize(
    ("files", "shown"),
    [
        pytest.param({"run/rounds.jsonl": None}, "<td>–</td><td class='dir'>", id="metrics_json_alone"),  # no last round
        pytest.param({"run/metrics.json": '{"seeds/count": null}'}, "</span>run</td>", id="seed_count_null"),  # no "(n seeds)"
        pytest.param({"run/metrics.json": '{"seeds/count": NaN}'}, "</span>run</td>", id="seed_count_nan"),
    ],
)
def test_a_run_that_records_less_is_reported(tmp_path: Path, files: dict[str, str | bytes | None], shown: str) -> None:
    _write(tmp_path, files)
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    assert shown in table((tmp_path / "report" / "index.html").read_text(), "runs")


def test_a_run_that_did_not_finish_is_not_called_final_and_a_stopped_attack_shows_no_score(tmp_path: Path) -> None:
    """A run stopped at round 2 has no ``metrics.json``: its values are the last recorded, not "Final metrics"; an attack
    stopped in it shows none of its earlier scores (issue 57)."""
    stopped = '{"round": 2, "attack/pli/stopped/seconds": 1.0}\n'
    runs = {"run/rounds.jsonl": ROUNDS + stopped, "run/metrics.json": None, "done/rounds.jsonl": ROUNDS}
    _write(tmp_path, {**runs, "done/metrics.json": '{"attack/pli/accuracy": 0.6}'})
    assert main(["report", str(tmp_path / "run"), str(tmp_path / "done"), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Final metrics" not in page and "Last recorded metrics (not final: " in page and "did not finish)" in page
    pli = table(page, "final section-attack/pli")
    assert pli.count("0.6") == 1  # the finished run's; the stopped attack's round-1 0.5 and round-2 0.6 are not shown as its
    assert main(["report", str(tmp_path / "done"), "--out", str(tmp_path / "report2")]) == 0
    assert "<h3>Final metrics</h3>" in (tmp_path / "report2" / "index.html").read_text()


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
