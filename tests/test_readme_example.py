"""The README's "Using the LightningModules on their own" example runs as written and writes nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

HEADING = "## Using the LightningModules on their own"


def readme_example() -> str:
    """The first python code block of the README section under :data:`HEADING`."""
    text = (REPO / "README.md").read_text()
    assert text.count(HEADING) == 1, f"README.md has no single section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert match, f"no ```python block under {HEADING!r}"
    return match.group(1)


def test_readme_lightning_module_example_runs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "example.py").write_text(readme_example())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "example.py"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = map(float, re.findall(r"(\d+\.\d+) (?:before|after)", proc.stdout))
    assert proc.stdout.startswith("(297, 1, 8, 8)") and after < before, proc.stdout
    assert sorted(p.name for p in work.iterdir()) == ["example.py"]
