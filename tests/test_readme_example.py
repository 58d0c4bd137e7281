"""The README's "Using the LightningModules on their own" examples run as written and write no files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import REPO

HEADING = "## Using the LightningModules on their own"


def readme_examples() -> list[str]:
    """Every python code block of the README section under :data:`HEADING`, in order."""
    text = (REPO / "README.md").read_text()
    assert text.count(HEADING) == 1, f"README.md has no single section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def _inversion_learns(stdout: str) -> None:
    before, after = map(float, re.findall(r"(\d+\.\d+) (?:before|after)", stdout))
    assert stdout.startswith("(297, 1, 8, 8)") and after < before, stdout


def _classifier_learns_and_reloads(stdout: str) -> None:
    match = re.match(r"test accuracy (\d\.\d+), logits \((\d+), 10\), restored gives the same logits: True$", stdout.strip())
    assert match and float(match.group(1)) > 0.8, stdout


#: What each example must print, in README order.
CHECKS: list[Callable[[str], None]] = [_inversion_learns, _classifier_learns_and_reloads]


def test_every_readme_example_has_a_check() -> None:
    assert len(readme_examples()) == len(CHECKS)


@pytest.mark.parametrize("index", range(len(CHECKS)), ids=[check.__name__.strip("_") for check in CHECKS])
def test_readme_example_runs_as_written_and_writes_nothing(tmp_path: Path, index: int) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "example.py"
    script.write_text(readme_examples()[index])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    CHECKS[index](proc.stdout)
    assert sorted(work.rglob("*")) == [], "the example left files in its working directory"
