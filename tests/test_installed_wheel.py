"""Issue 58: fdattack as a user installs it. The wheel is built from this tree, installed with pip into a fresh venv, and
run from an empty folder outside the clone, with nothing of the clone on the path: the quick start, an AT&T faces run
(the data where ``FDATTACK_DATA`` says), a packaged matrix preset, a sweep trial and an installed plugin.

The venv holds fdattack's wheel and the plugin package only; the dependencies (torch and the rest) are read from this
interpreter's site folders through a ``.pth`` file, since there is no network to install them again. Those folders'
own ``.pth`` files are not run, so the clone's editable install is not on the venv's path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, SHARED_DATA
from tests.test_plugins import EXAMPLE, VOTES

PIP = ["-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir", "--disable-pip-version-check", "--quiet"]
#: what shrinks a run to seconds (one round, two clients, few epochs, W&B off, no progress bars)
SMALL = [
    "logger.wandb.mode=disabled",
    "logger.progress=never",
    "protocol.num_clients=2",
    "protocol.rounds=1",
    "evaluation.epochs=1",
    "evaluation.confidence_gap.enabled=false",
]


@dataclass(frozen=True)
class Installed:
    """A venv with fdattack's wheel (and the docs' plugin package) installed, and an empty folder to run in."""

    venv: Path
    work: Path

    def run(self, *argv: str, cwd: Path | None = None, module: bool = False) -> subprocess.CompletedProcess[str]:
        """``fdattack ARGV`` (the venv's console script, or ``python -m fdattack``) in ``cwd`` (the empty folder)."""
        env = {
            key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "PYTEST", "VIRTUAL_ENV", "WANDB", "FDATTACK"))
        }
        env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FDATTACK_DATA": str(SHARED_DATA), "WANDB_SILENT": "true"}
        env |= {f"WANDB_{kind}_DIR": str(self.work.parent / f"wandb-{kind.lower()}") for kind in ("CACHE", "CONFIG", "DATA")}
        env["WANDB_DIR"] = str(self.work.parent / "wandb-dir")  # nothing written outside the test's folder
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        command = [str(self.venv / "bin" / "python"), "-m", "fdattack"] if module else [str(self.venv / "bin" / "fdattack")]
        return subprocess.run([*command, *argv], cwd=cwd or self.work, env=env, capture_output=True, text=True, timeout=600)


def _check(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"  # the tree as an sdist would hold it: the build writes only here
    shutil.copytree(REPO / "fdattack", source / "fdattack", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        shutil.copy(REPO / name, source / name)
    wheel_cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--quiet",
        "-w",
        str(root / "dist"),
    ]
    plugin = root / "fdattack-myattack"  # docs/plugins.md's package, installed beside fdattack as a user installs it
    (plugin / "fdattack_myattack").mkdir(parents=True)
    (plugin / "pyproject.toml").write_text(EXAMPLE["toml"])
    (plugin / "fdattack_myattack" / "__init__.py").write_text(VOTES)
    for project in (source, plugin):
        _check(subprocess.run([*wheel_cmd, str(project)], capture_output=True, text=True, timeout=300))
    venv = root / "venv"
    _check(subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300))
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True)
    sites = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")] or [sysconfig.get_paths()["purelib"]]
    Path(purelib.stdout.strip(), "fdattack_test_dependencies.pth").write_text("\n".join(sites) + "\n")
    _check(subprocess.run([python, *PIP, *map(str, (root / "dist").glob("*.whl"))], capture_output=True, text=True, timeout=300))
    (root / "work").mkdir()
    found = _check(
        subprocess.run([python, "-c", "import fdattack; print(fdattack.__file__)"], cwd=root / "work", capture_output=True, text=True)
    )
    assert Path(found.stdout.strip()).is_relative_to(venv), found.stdout  # the wheel's copy, not the clone's
    return Installed(venv, root / "work")


def test_the_version_is_the_changelog_s_top_entry(installed: Installed) -> None:
    top = re.search(r"^## (\d+\.\d+\.\d+) — ", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert top is not None and _check(installed.run("--version")).stdout.strip() == f"fdattack {top.group(1)}"


def test_the_quick_start_warns_of_nothing_and_keeps_its_classifier(installed: Installed) -> None:
    """The README's first command (W&B offline, as it is by default), one round of it: no warning on a fresh run (the
    build's evaluation classifier was taken for a stranded run's file, and deleted), the classifier kept."""
    proc = _check(installed.run("run", *[o for o in SMALL if not o.startswith("logger.wandb")], "output_dir=quick"))
    assert "after round 1:" in proc.stdout and "ldia" in proc.stdout
    assert not re.search(r"warn|clearing|stranded|Traceback", proc.stderr, re.IGNORECASE), proc.stderr[-3000:]
    assert list((installed.work / "quick" / "artifacts").glob("identity_classifier_*.pt"))


def test_an_experiment_by_name_on_att_faces_where_fdattack_data_says(installed: Installed) -> None:
    """``pli_fedmd_att_faces`` is found in the package with its ``defaults:`` (FedMD, att_faces, the paper's attack
    knobs), the faces under ``$FDATTACK_DATA``."""
    _check(installed.run("run", "pli_fedmd_att_faces", *SMALL, "attacks=[ldia]", "output_dir=faces"))
    config = yaml.safe_load((installed.work / "faces" / "config.yaml").read_text())
    assert config["data"]["root"] == str(SHARED_DATA / "att_faces") and config["protocol"]["name"] == "fedmd"
    assert json.loads((installed.work / "faces" / "metrics.json").read_text())["attack/ldia/kl"] >= 0


def test_a_packaged_matrix_preset_and_a_copy_of_it(installed: Installed) -> None:
    """``fdattack matrix small --list`` plans the packaged preset's cells from an empty folder; ``fdattack init`` copies
    the presets, and a copy cut to one cell runs to its matrix.json."""
    listed = _check(installed.run("matrix", "small", "--list")).stdout
    assert "att_faces/fedmd/none/0\tto run" in listed and "mnist_gan/fedavg/control/2\tto run" in listed
    mine = installed.work / "mine"
    mine.mkdir()
    assert "files in" in _check(installed.run("init", cwd=mine)).stdout
    assert (mine / "sweeps" / "pli_tau_gamma.yaml").is_file() and (mine / "conf" / "experiment" / "pli_fedmd_digits.yaml").is_file()
    preset = yaml.safe_load((mine / "conf" / "matrix" / "small.yaml").read_text())
    cut = {**preset, "name": "cut", "seeds": [0], "protocols": {"fedmd": []}, "defenses": {"none": []}, "attacks": ["ldia"]}
    cut |= {"data": {"mnist": preset["data"]["mnist"]}, "overrides": [*preset["overrides"], *SMALL], "skip": []}
    cut = {key: value for key, value in cut.items() if key not in ("control", "decide")}
    (mine / "conf" / "matrix" / "cut.yaml").write_text(yaml.safe_dump(cut))
    _check(installed.run("matrix", "cut", cwd=mine))
    cells = json.loads((mine / "runs" / "matrix" / "cut" / "matrix.json").read_text())["cells"]
    assert [(cell["id"], cell["status"]) for cell in cells] == [("mnist/fedmd/none", "done")]


def test_a_packaged_sweep_runs_a_trial_from_any_folder(installed: Installed) -> None:
    proc = _check(installed.run("sweep", "pli_tau_gamma", "--count", "1", *SMALL, "attack.pli.epochs_per_round=1"))
    assert "trial_000" in proc.stdout
    assert (installed.work / "runs" / "sweeps" / "pli_tau_gamma" / "trial_000" / "metrics.json").is_file()


def test_an_installed_plugin_runs_and_is_scored(installed: Installed) -> None:
    _check(installed.run("run", *SMALL, "attacks=[myattack,ldia]", "output_dir=plugin"))
    metrics = json.loads((installed.work / "plugin" / "metrics.json").read_text())
    assert 0 <= metrics["attack/myattack/kl"] < metrics["attack/myattack/uniform_kl"]
