"""Every page's code runs: the python blocks of the docs and the README, their ``fdattack run`` lines, and the site.

- Every ```` ```python ```` block of every page (``README.md`` and ``docs/**/*.md``) runs, a page's blocks in page
  order in one namespace, in a subprocess with one torch thread whose working directory is a fresh folder under
  pytest's ``tmp_path`` (holding a copy of ``conf/``, as the repository root would); the blocks that
  :data:`CHECKS` names must print what it asserts, and no page's blocks may leave a file behind but a run directory
  under ``runs/`` (where a run writes it).
- Every line of a ```` ```bash ````, ```` ```sh ```` or ```` ```console ```` block whose command (or a command after
  ``&&``, ``||``, ``;``) is ``fdattack run`` or ``python -m fdattack run`` composes with
  :func:`fdattack.config.compose`, so no page names a stale config key.
- ``mkdocs build --strict`` builds the site.

A block that must not run carries the marker ``<!-- not run: REASON -->`` on the line right before its fence
(``docs/development.md``); nothing else is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"^[ \t]*<!--[ \t]*not run:(?P<reason>.*?)-->[ \t]*$", re.M)
SHELL = {"bash", "sh", "console", "shell"}
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "NO_MKDOCS_2_WARNING": "1",
    "WANDB_MODE": "disabled",
    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
}


@dataclass(frozen=True)
class Block:
    page: str  #: path relative to the repository root
    line: int  #: line of the opening fence, from 1
    lang: str
    code: str
    not_run: str | None  #: the marker's reason, or None


def page_name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page`` in order; a block preceded by a not-run marker carries its reason."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.fullmatch(before)
        indent = match.group("indent")
        code = "".join(line.removeprefix(indent) for line in match.group("body").splitlines(keepends=True))
        found.append(
            Block(
                page_name(page),
                text.count("\n", 0, match.start()) + 1,
                match.group("info").split(" ")[0].strip(),
                code,
                marker.group("reason").strip() if marker else None,
            )
        )
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def test_every_not_run_marker_has_a_reason_and_precedes_a_block() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        fences = {text.count("\n", 0, m.start()) + 1 for m in FENCE.finditer(text)}
        for marker in NOT_RUN.finditer(text):
            line = text.count("\n", 0, marker.start()) + 1
            assert marker.group("reason").strip(), f"{page_name(page)}:{line}: a not-run marker must say why"
            assert line + 1 in fences, f"{page_name(page)}:{line}: a not-run marker must be the line right before a fence"


# --- (a) python blocks -------------------------------------------------------------------------------------------


def _inversion_learns(stdout: str) -> None:
    before, after = map(float, re.findall(r"(\d+\.\d+) (?:before|after)", stdout))
    assert stdout.startswith("(297, 1, 8, 8)") and after < before, stdout


def _classifier_learns_and_reloads(stdout: str) -> None:
    match = re.match(r"test accuracy (\d\.\d+), logits \((\d+), 10\), restored gives the same logits: True$", stdout.strip())
    assert match and float(match.group(1)) > 0.8, stdout


#: What a page's python blocks must print: (page, index among the page's python blocks) -> check of its stdout.
def _run_from_python_prints_its_metrics(stdout: str) -> None:
    assert re.fullmatch(r"LDIA KL \d+\.\d{3}, client accuracy [01]\.\d{3}", stdout.splitlines()[-1]), stdout[-500:]


CHECKS: dict[tuple[str, int], Callable[[str], None]] = {
    ("docs/running.md", 0): _run_from_python_prints_its_metrics,
    ("docs/lightning-modules.md", 0): _inversion_learns,
    ("docs/lightning-modules.md", 1): _classifier_learns_and_reloads,
}

#: Runs one page's blocks in one namespace, each block's stdout captured apart; argv: blocks.json outputs.json.
DRIVER = """\
import contextlib, io, json, sys
import torch
torch.set_num_threads(1)
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
outputs = []
for block in blocks:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(block["code"], block["where"], "exec"), namespace)
    outputs.append(buffer.getvalue())
    with open(sys.argv[2], "w") as f:
        json.dump(outputs, f)
"""


def python_blocks(page: str) -> list[Block]:
    return [b for b in ALL_BLOCKS if b.page == page and b.lang == "python"]


PYTHON_PAGES = sorted({b.page for b in ALL_BLOCKS if b.lang == "python" and b.not_run is None})


def test_every_check_names_a_block_that_runs() -> None:
    for page, index in CHECKS:
        runs = python_blocks(page)
        assert index < len(runs) and runs[index].not_run is None, f"{page} has no runnable python block #{index}"


@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_page_python_blocks_run_in_order_and_write_nothing(tmp_path: Path, page: str) -> None:
    all_python = python_blocks(page)
    runnable = [(i, b) for i, b in enumerate(all_python) if b.not_run is None]
    work = tmp_path / "work"
    shutil.copytree(REPO / "conf", work / "conf")  # the examples run "from the repository root"
    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "blocks.json").write_text(json.dumps([{"code": b.code, "where": f"{page}:{b.line}"} for _, b in runnable]))
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json"), str(tmp_path / "out.json")],
        cwd=work,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = json.loads((tmp_path / "out.json").read_text())
    assert len(outputs) == len(runnable)
    for (index, _), stdout in zip(runnable, outputs):
        if (page, index) in CHECKS:
            CHECKS[page, index](stdout)
    # a run writes its run directory under runs/, as the command does; nothing else may be left behind
    left = sorted(
        p.relative_to(work).as_posix() for p in work.rglob("*") if not (p.is_relative_to(work / "conf") or p.is_relative_to(work / "runs"))
    )
    assert left == [], f"{page}'s examples left files in their working directory: {left}"


# --- (b) `fdattack run` lines ------------------------------------------------------------------------------------


def _commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``&&``, ``||``, ``;``, ``|``, ``&`` and parentheses)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set("&|;()"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _run_args(command: list[str]) -> list[str] | None:
    """The tokens after ``run`` of an ``fdattack run`` or ``python -m fdattack run`` command, else None."""
    for prefix in (["fdattack", "run"], ["python", "-m", "fdattack", "run"], ["python3", "-m", "fdattack", "run"]):
        if command[: len(prefix)] == prefix:
            return command[len(prefix) :]
    return None


@dataclass(frozen=True)
class RunLine:
    where: str
    experiment: str | None
    overrides: tuple[str, ...]


def run_lines() -> list[RunLine]:
    found = []
    for block in ALL_BLOCKS:
        if block.lang not in SHELL or block.not_run is not None:
            continue
        lines = block.code.replace("\\\n", " ").splitlines()  # continuation lines join their command
        for offset, line in enumerate(lines):
            line = re.sub(r"^\s*\$ ", "", line)  # a console prompt
            for command in _commands(line):
                args = _run_args(command)
                if args is None or any(a.startswith("--help") for a in args):
                    continue
                tokens = [a for a in args if not a.startswith("-")]  # --print-config and the like
                if not tokens and args:
                    continue  # flag-only
                experiment, overrides = (tokens[0], tokens[1:]) if tokens and "=" not in tokens[0] else (None, tokens)
                found.append(RunLine(f"{block.page}:{block.line + 1 + offset}", experiment, tuple(overrides)))
    return found


RUN_LINES = run_lines()


def test_the_docs_name_fdattack_run_lines() -> None:
    assert len(RUN_LINES) >= 5, RUN_LINES  # the parser still finds the pages' command lines


@pytest.mark.parametrize("run_line", RUN_LINES, ids=[r.where for r in RUN_LINES])
def test_fdattack_run_line_composes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_line: RunLine) -> None:
    from fdattack.config import compose
    from fdattack.config.packaged import is_plain_name
    from fdattack.errors import ConfigError

    monkeypatch.chdir(tmp_path)  # compose reads conf/ from the repository (cwd holds none) and writes nothing
    given = run_line.experiment
    experiment = None if given is None else given if is_plain_name(given) and not given.endswith(".yaml") else REPO / given
    try:
        compose(experiment, list(run_line.overrides))
    except ConfigError as err:
        # compose checks that a dataset's folder exists (data.root, data.public_dataset.root), under the same error
        # class as a stale key; a page may name data that is not on this machine, so that message alone is let pass
        if not re.match(r"^[\w.]*\broot='[^']*': folder not found", str(err)):
            raise AssertionError(f"{run_line.where}: {err}") from None


# --- (c) the site ------------------------------------------------------------------------------------------------


def test_mkdocs_builds_the_site_strictly(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed (pip install -e '.[test]' installs mkdocs):\n{proc.stderr[-5000:]}"
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "api" / "attacker" / "index.html").is_file()


CITED_TEST = re.compile(r"`(?:tests/)?(?P<file>test_\w+\.py)::(?P<name>test_\w+?)(?:\.\.\.)?`")


def test_every_test_the_pages_cite_exists() -> None:
    """Every ``test_file.py::test_name`` a page cites (docs/evidence.md cites one per claim; a trailing ``...`` marks a
    cited prefix) names a test function in that file, so no claim rests on a test renamed or gone."""
    cited = [(page.name, m["file"], m["name"]) for page in PAGES for m in CITED_TEST.finditer(page.read_text(encoding="utf-8"))]
    assert len(cited) >= 20, cited  # evidence.md alone cites more
    missing = [
        (page, file, name)
        for page, file, name in cited
        if not re.search(
            rf"^def {name}", (REPO / "tests" / file).read_text(encoding="utf-8") if (REPO / "tests" / file).is_file() else "", re.M
        )
    ]
    assert not missing, missing
