"""``cache_dir``: the networks that depend on no cell (PLI's learned prior, GMI's WGAN-GP prior, the evaluation
classifiers) are trained by the first run that needs them and read back by the next, which gives the same results as a
run without the cache; an isolated attack writes its own entries and reads no other's. (The leakage matrix names one
cache for all its cells: tests/test_matrix.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fdattack.config import compose
from fdattack.experiment import Experiment
from tests.conftest import tiny
from tests.test_gan_attacks import DIGITS, FEDAVG

PLI = [
    "attacks=[pli]",
    "protocol.rounds=1",
    "attack.pli.max_width=32",
    "attack.pli.epochs_per_round=1",
    "attack.pli.prior.kind=learned",
    "attack.pli.prior.epochs=1",
    "attack.pli.prior.width=8",
    "evaluation.epochs=1",
    "evaluation.confidence_gap.enabled=false",
]
GMI = [
    *DIGITS,
    "attacks=[gmi]",
    "protocol.rounds=1",
    "attack.gmi.gan_epochs=1",
    "attack.gmi.gan_width=8",
    "attack.gmi.iterations=5",
    "attack.gmi.seeds=2",
    "evaluation.inversion.epochs=1",
]


def _run(folder: Path, experiment: Path | None, *overrides: str) -> dict[str, float]:
    """The run's metrics, its wall times left out."""
    metrics = Experiment(compose(str(experiment) if experiment else None, tiny(folder, *overrides))).run()
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


def _entries(cache: Path) -> dict[str, int]:
    """Each entry's path under ``cache`` and its modification time."""
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*.pt")}


def test_a_second_run_reads_the_pli_prior_and_classifier_back_and_scores_the_same(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    plain = _run(tmp_path / "plain", None, *PLI)
    with caplog.at_level(logging.INFO, logger="fdattack"):
        first = _run(tmp_path / "first", None, *PLI, f"cache_dir={cache}")
    made = _entries(cache)
    assert sorted(Path(k).parent.as_posix() + "/" + Path(k).name.split("_")[0] for k in made) == ["attacks/pli/pli", "evaluation/identity"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fdattack"):
        second = _run(tmp_path / "second", None, *PLI, f"cache_dir={cache}")
    assert _entries(cache) == made  # nothing trained, nothing written again
    assert not [r for r in caplog.records if "training" in r.getMessage()]
    assert first == plain and second == plain  # a cached network is the network the run trains
    other = _run(tmp_path / "other", None, *PLI, f"cache_dir={cache}", "attack.pli.prior.epochs=2")
    assert len(_entries(cache)) == 3 and other["attack/pli/prior_ssim"] != plain["attack/pli/prior_ssim"]  # a changed key trains anew


def test_an_isolated_attack_writes_its_own_gan_prior_and_a_second_run_reads_it(tmp_path: Path) -> None:
    """GMI in a Landlock-confined worker: it may write ``cache_dir/attacks/gmi`` (and nothing of the evaluation side); the
    WGAN-GP prior it trains is read back by the next run, in process, with the same results (isolated and in-process
    runs agree without a cache: tests/test_isolation.py)."""
    cache = tmp_path / "cache"
    seed = "attack_seed=7"  # the same attacks' seed in both runs (an isolated run's is otherwise a secret of its own)
    isolated = _run(tmp_path / "isolated", FEDAVG, *GMI, f"cache_dir={cache}", "isolation.mode=process", seed)  # trains, writes
    made = _entries(cache)
    assert sorted(k.split("_")[0] for k in made) == ["attacks/gmi/gan", "evaluation/inversion"]
    again = _run(tmp_path / "again", FEDAVG, *GMI, f"cache_dir={cache}", seed)  # reads
    assert _entries(cache) == made
    assert again == isolated  # what it read back is what the worker trained
