"""Seeds as an axis: ``fdattack run ... seeds=[0,1]`` runs a replica per seed and writes their aggregate; running it again
continues; the report groups replicas into their mean with a band; every run records its machine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from fdattack.cli import main
from fdattack.report.runs import load_runs
from fdattack.statistics.across_seeds import seed_within
from fdattack.statistics.intervals import rate_interval, t_interval
from tests.conftest import error_of, tiny
from tests.report_runs import fake_run

#: public_mean reads nothing from the protocol and trains nothing: seconds per replica, scores that move with the split
SEEDED = (
    "seeds=[0,1]",
    "protocol.rounds=1",
    "attacks=[public_mean]",
    "evaluation.classifier=null",
    "evaluation.confidence_gap.enabled=false",
)
SSIM = "attack/public_mean/ssim"


def _metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("seeds")
    assert main(["run", *tiny(base, *SEEDED)]) == 0
    return base / "run"


def test_each_seed_is_a_replica_in_its_own_folder(seeded: Path) -> None:
    for seed in (0, 1):
        stored = OmegaConf.load(seeded / f"seed_{seed}" / "config.yaml")
        assert stored.seed == seed and stored.seeds is None and stored.logger.wandb.group == "run"
        assert stored.logger.wandb.name.endswith(f"-seed{seed}")
    assert _metrics(seeded / "seed_0")[SSIM] != _metrics(seeded / "seed_1")[SSIM]  # the split moves with the seed


def test_the_aggregate_is_mean_std_and_t_interval_across_the_seeds(seeded: Path) -> None:
    """SSIM is signed: Student's t across the seeds, each seed's own interval over its targets a floor under their spread,
    cut to [−1, 1] (rates and distances take their own scales: tests/test_intervals.py)."""
    replicas = [_metrics(seeded / f"seed_{seed}") for seed in (0, 1)]
    aggregate = _metrics(seeded)
    values = np.array([r[SSIM] for r in replicas])
    assert aggregate["seeds/count"] == 2
    assert aggregate[SSIM] == pytest.approx(values.mean())
    assert aggregate[SSIM + "_seed_std"] == pytest.approx(values.std(ddof=1))
    within = [seed_within(r, SSIM) for r in replicas]
    expected = t_interval(values, within=within, bounds=(-1.0, 1.0))
    assert (aggregate[SSIM + "_ci_low"], aggregate[SSIM + "_ci_high"]) == pytest.approx(expected)
    rounds = [json.loads(line) for line in (seeded / "rounds.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rounds] == [0, 1] and rounds[1][SSIM] == pytest.approx(values.mean())
    table = (seeded / "seeds.csv").read_text().splitlines()
    assert table[0] == "metric,mean,std,ci_low,ci_high,seed_0,seed_1"
    row = next(line for line in table if line.startswith(SSIM + ","))
    assert [float(v) for v in row.split(",")[-2:]] == pytest.approx(list(values), rel=1e-5)
    assert OmegaConf.load(seeded / "config.yaml").seeds == [0, 1]


def test_every_run_records_its_machine(seeded: Path) -> None:
    (machine,) = json.loads((seeded / "seed_0" / "machine.json").read_text())
    assert machine["start_round"] == 0 and machine["cpu_model"] and machine["torch_threads"] >= 1 and machine["torch_version"]
    assert json.loads((seeded / "machine.json").read_text())["cpu_cores"] >= 1


def test_running_again_reads_finished_replicas_and_resumes_a_cut_one(seeded: Path) -> None:
    before = _metrics(seeded)
    finished = (seeded / "seed_0" / "metrics.json").stat().st_mtime_ns
    (seeded / "seed_1" / "metrics.json").unlink()  # seed 1 cut short after its last checkpoint
    assert main(["run", *tiny(seeded.parent, *SEEDED)]) == 0
    assert (seeded / "seed_0" / "metrics.json").stat().st_mtime_ns == finished  # not run again
    machine = json.loads((seeded / "seed_1" / "machine.json").read_text())
    assert [start["start_round"] for start in machine] == [0, 1]  # resumed after round 1
    after = _metrics(seeded)
    assert after.keys() == before.keys()
    assert all(after[k] == pytest.approx(before[k], nan_ok=True) for k in before if not k.startswith("time/"))


def test_a_replica_finished_with_another_config_is_exit_2(seeded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *tiny(seeded.parent, *SEEDED, "evaluation.max_candidates=50")]) == 2
    err = capsys.readouterr().err.strip()
    err = error_of(err)
    assert "seed_0" in err and "evaluation" in err


@pytest.mark.parametrize(("value", "named"), [("[]", "names no seed"), ("[1,1]", "repeats a seed"), ("[-1]", "out of range")])
def test_bad_seeds_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, named: str) -> None:
    assert main(["run", *tiny(tmp_path, f"seeds={value}")]) == 2
    err = capsys.readouterr().err.strip()
    err = error_of(err)
    assert "seeds" in err and named in err
    assert not (tmp_path / "run").exists()


def test_the_report_groups_runs_that_differ_only_by_seed(tmp_path: Path) -> None:
    """Three seeds at tau 1 and one run at tau 3: two entries, the first their mean with a band and intervals."""
    paths = [fake_run(tmp_path / f"s{seed}", 1.0, 0.1 * seed, seed=seed) for seed in range(3)]
    for seed, path in enumerate(paths):  # the same config but for the seed
        config = OmegaConf.load(path / "config.yaml")
        config.seed, config.attack.pli.gamma = seed, 0.0
        OmegaConf.save(config, path / "config.yaml")
        rows = [json.loads(line) for line in (path / "rounds.jsonl").read_text().splitlines()]
        for row in rows:
            if "attack/pli/accuracy" in row:
                row["attack/pli/accuracy"] = 0.2 + 0.1 * seed
        (path / "rounds.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        (path / "metrics.json").unlink()
    other = fake_run(tmp_path / "tau3", 3.0, 0.0, seed=9)
    runs, _ = load_runs([*paths, other])
    assert len(runs) == 2 and runs[0].replicas == paths and runs[0].label.endswith("(3 seeds)")
    assert runs[0].final["attack/pli/accuracy"] == pytest.approx(0.3)
    assert (runs[0].final["attack/pli/accuracy_ci_low"], runs[0].final["attack/pli/accuracy_ci_high"]) == pytest.approx(
        rate_interval([0.2, 0.3, 0.4])  # a rate: Wilson's with the effective number of trials, inside [0, 1]
    )
    assert main(["report", *map(str, [*paths, other]), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    low, high = rate_interval([0.2, 0.3, 0.4])
    assert f"[{low:.3g}, {high:.3g}]" in page and "(3 seeds)" in page
    assert 'id="band0"' in (tmp_path / "report" / "plots" / "attack_pli__accuracy.svg").read_text()
    assert not math.isnan(low)
