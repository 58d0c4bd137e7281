"""The README's first run (``fdattack run`` with no arguments: FedMD on scikit-learn's digits, 4 clients, 5 rounds):
its LDIA leaks, the KL of its estimate to each client's true label distribution below the uniform guess's, by the
verdict rule of the leakage matrix (:func:`fdattack.statistics.verdicts.decide`) over seeds 42, 0 and 1, paired seed by
seed with the uniform guess, the attacker's best without the uploads.

The default config itself with ``attacks=[ldia]``: LDIA is an observer of the uploads, so dropping PLI and TBI leaves
its figures unchanged (seed 42 gives the README table's KL 1.182 [0.786, 1.700] either way); about 20 s a seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fdattack.cli import main
from fdattack.statistics.verdicts import MARGINS, Verdict, decide

SEEDS = (42, 0, 1)
KL, UNIFORM = "attack/ldia/kl", "attack/ldia/uniform_kl"


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _default_run(out: Path, seed: int) -> dict[str, float]:
    argv = ["run", "attacks=[ldia]", f"seed={seed}", "logger.wandb.mode=disabled", "logger.progress=never", f"output_dir={out}"]
    assert main(argv) == 0
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.slow
def test_the_default_runs_ldia_leaks_beyond_the_uniform_guess_at_three_seeds(tmp_path: Path) -> None:
    """README, "What the first run shows": LDIA reads which digits each client holds.

    Measured on a 2-core Intel Xeon @ 2.80 GHz, seeds 42 / 0 / 1: KL 1.182 / 1.089 / 1.162 against the uniform guess's
    2.129 at every seed (the default partition gives every seed the same label counts): differences −0.947 / −1.040 /
    −0.967, a spread of 0.093, so the interval's upper end (about −0.86) lies 0.86 below 0. Asserted: the verdict is
    *leaks* (the 95 % t interval of the paired differences wholly below 0, at 2 degrees of freedom; the margin of the
    KL kind, 0.1, decides only a stop), and each seed's KL lies below the uniform guess's. It fails where LDIA
    estimates nothing (its KL then is the uniform guess's or a random guess's, above it) or where the baseline is
    computed against another truth.
    """
    runs = [_default_run(tmp_path / str(seed), seed) for seed in SEEDS]
    values, controls = [r[KL] for r in runs], [r[UNIFORM] for r in runs]
    assert all(v < c for v, c in zip(values, controls)), list(zip(SEEDS, values, controls))
    decision = decide(values, controls, float(MARGINS["kl"]), lower_leaks=True, bounds=(0.0, float("inf")))
    assert decision.verdict is Verdict.leaks, (decision, list(zip(SEEDS, values, controls)))
