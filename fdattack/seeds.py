"""``fdattack run EXP.yaml seeds=[0,1,2]``: one replica of the run per seed, and their aggregate.

Each replica is an ordinary run (:class:`~fdattack.experiment.Experiment`) at ``seed=<s>`` in
``<output_dir>/seed_<s>/``, logged to W&B in one group (``logger.wandb.group``, else the folder's name) as
``<name>-seed<s>``. The folder itself then holds the aggregate (:mod:`fdattack.tracking.seed_aggregate`):
``metrics.json`` and ``rounds.jsonl`` with every metric's mean, ``_seed_std`` and 95 % interval across the seeds,
``seeds.csv`` (a row per metric with each seed's value), ``config.yaml`` (the config with its ``seeds``) and
``machine.json``, so that ``fdattack report <output_dir>`` plots the mean with its band.

Running the same command again continues: a replica with ``metrics.json`` made with the same config is done and not
run again, one cut short resumes from its last checkpoint, the others start; a replica made with another config, or
with nothing to show which (no ``config.yaml``), stops the run, and so does an ``output_dir`` holding a single run.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Callable

from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from fdattack.errors import CheckpointError, FdattackError
from fdattack.tracking import RunDirectory, atomic_write, attack_summary, to_jsonable
from fdattack.tracking.folder_owner import run_results_in
from fdattack.tracking.machine import machine_info
from fdattack.tracking.results import read_result
from fdattack.tracking.run_dir import refuse_matrix_root
from fdattack.tracking.seed_aggregate import aggregate_metrics, aggregate_rounds, seeds_table

log = logging.getLogger("fdattack")

#: the replicas' folders under the output directory
REPLICA_PREFIX = "seed_"
#: runs one replica's config (seeds=None) to its final metrics: :func:`fdattack.experiment.run`
RunOne = Callable[[DictConfig], dict[str, float]]


def replica_config(cfg: DictConfig, seed: int, folder: Path, group: str, resume: bool) -> DictConfig:
    """``cfg`` as the replica of ``seed``: one seed, its own folder, the seeds' W&B group, its own W&B run name."""
    replica = copy.deepcopy(cfg)
    OmegaConf.set_readonly(replica, False)
    replica.seed, replica.seeds, replica.output_dir, replica.resume = seed, None, str(folder), resume
    wandb = replica.logger.wandb
    wandb.group = wandb.group or group
    wandb.name = f"{wandb.name or cfg.name}-seed{seed}"
    wandb.job_type = wandb.job_type or "seed-replica"
    OmegaConf.set_readonly(replica, True)
    return replica


def _write_json(path: Path, value: object) -> None:
    text = json.dumps(to_jsonable(value), sort_keys=True, indent=2, allow_nan=False) + "\n"
    atomic_write(path, lambda handle: handle.write(text.encode()))


def _read_rounds(folder: Path) -> list[dict]:
    path = folder / "rounds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def run_replica(cfg: DictConfig, seed: int, root: Path, group: str, run: RunOne) -> dict[str, float]:
    """The final metrics of the replica of ``seed``: read when it finished before, made with this config
    (:func:`~fdattack.tracking.results.read_result`), else ``run`` (resumed from its last checkpoint where it has one).

    Raises:
        CheckpointError: the finished replica was made with another config, or has no ``config.yaml`` to show it.
        DataError: its ``metrics.json`` is damaged.
    """
    folder = root / f"{REPLICA_PREFIX}{seed}"
    replica = replica_config(cfg, seed, folder, group, resume=True)
    if (folder / "metrics.json").is_file():
        try:
            metrics = read_result(folder, replica)
        except FdattackError as err:
            raise type(err)(f"seed {seed}: {err}; run these seeds in another output_dir, or delete {folder} to run it again") from None
        log.info("seed %d: finished before, in %s", seed, folder)
        return metrics
    resume = RunDirectory(folder).checkpoints.latest() is not None
    log.info("seed %d: %s in %s", seed, "resuming" if resume else "running", folder)
    return run(replica_config(cfg, seed, folder, group, resume))


def check_seeds_folder(root: Path) -> None:
    """A seeds run's ``output_dir`` is new, or holds replicas (``seed_*``) and their aggregate, never a single run's
    results, which the aggregate's files would overwrite, nor a matrix's root.

    Raises:
        CheckpointError: ``root`` is a file or a matrix's root, or holds a single run's results
            (:func:`~fdattack.tracking.folder_owner.run_results_in`).
    """
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"output_dir {root} exists and is not a folder; choose another output_dir")
    refuse_matrix_root(root)
    if run_results_in(root) == "a run's results":
        raise CheckpointError(
            f"output_dir {root} holds a single run's results, which the seeds' aggregate would overwrite; "
            "choose another output_dir for the seeds"
        )


def run_seeds(cfg: DictConfig, root: Path, run: RunOne) -> dict[str, float]:
    """Run (or continue) every replica of ``cfg.seeds`` under ``root`` with ``run``, then write and return their aggregate.

    Raises:
        FdattackError: as a run does; CheckpointError: a replica finished with another config.
    """
    seeds = [int(s) for s in cfg.seeds]
    check_seeds_folder(root)
    group = str(cfg.logger.wandb.group or root.name)
    finals = [run_replica(cfg, seed, root, group, run) for seed in seeds]
    aggregate = write_aggregate(cfg, root, seeds, finals)
    if getattr(rank_zero_only, "rank", 0) != 0:
        return aggregate
    table = attack_summary(aggregate)
    if table:
        print(f"mean over seeds {', '.join(map(str, seeds))} [95 % interval across the seeds]:\n{table}")
    print(
        f"fdattack: {len(seeds)} seeds, aggregate in {root.resolve()} (metrics.json, seeds.csv, rounds.jsonl; replicas in "
        f"{REPLICA_PREFIX}*/)"
    )
    return aggregate


def write_aggregate(cfg: DictConfig, root: Path, seeds: list[int], finals: list[dict[str, float]]) -> dict[str, float]:
    """The aggregate of the replicas' final metrics ``finals`` (one per seed of ``seeds``), written into ``root``:
    ``metrics.json``, ``rounds.jsonl`` (from the replicas' own), ``seeds.csv``, ``config.yaml`` and ``machine.json``.
    Under DDP every rank ran the replicas; rank 0 alone writes."""
    aggregate = aggregate_metrics(finals)
    if getattr(rank_zero_only, "rank", 0) != 0:
        return aggregate
    rounds = aggregate_rounds([_read_rounds(root / f"{REPLICA_PREFIX}{seed}") for seed in seeds])
    root.mkdir(parents=True, exist_ok=True)
    config = OmegaConf.to_yaml(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)))
    atomic_write(root / "config.yaml", lambda handle: handle.write(config.encode()))
    lines = "".join(json.dumps(to_jsonable(row), allow_nan=False) + "\n" for row in rounds)
    atomic_write(root / "rounds.jsonl", lambda handle: handle.write(lines.encode()))
    _write_json(root / "metrics.json", aggregate)
    _write_json(root / "machine.json", machine_info())
    atomic_write(root / "seeds.csv", lambda handle: handle.write(seeds_table(seeds, finals, aggregate).encode()))
    return aggregate
