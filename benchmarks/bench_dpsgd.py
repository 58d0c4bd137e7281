"""DP-SGD local epochs of K clients on MNIST-sized inputs: opacus one client at a time against the vectorised path.

For each K the script builds K clients of ``--model`` (``pli_cnn``, the network of the MNIST PDA-FD configs, e.g.
``conf/experiment/ldia_lira_fedmd_mnist.yaml``; or ``pdafd_cnn``) on ``--rows`` synthetic 1x28x28 images each, wraps
them with the ``dpsgd`` defense (σ = 1, C = 10, Poisson sampling at q = B / rows, Adam) and times local epochs of
private training, twice:

- ``opacus``: ``trainer.vectorise=false``, the engine's per-client loop, each client through opacus' hooks and
  ``DPOptimizer`` (the defense's job ``session``);
- ``vmapped``: all clients' DP-SGD steps as one vmapped per-sample gradient computation
  (:func:`fdattack.engine.vectorised.fit_private_copies`, what ``fit_many`` calls for two or more clients; called
  directly here so that K = 1 times the path too, although the engine sends a lone client to opacus).

Both draw the same Poisson batches and noise (the workers check that they take the same number of steps). Printed
per K: seconds per local epoch (median over the timed epochs of every repeat, after one warm-up epoch per process) of
each and the speed-up, in wall-clock time and in the process's CPU time (less disturbed by other work on a shared
machine). Each (K, implementation) runs in its own subprocess, alternating, one thread per process
(``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``), with the ``fdattack`` command's allocator setting
(:func:`fdattack.engine.malloc.keep_freed_memory`).

Usage: ``python benchmarks/bench_dpsgd.py [--repeats 3] [--epochs 2] [--clients 1 4 10] [--rows 640] [--model pli_cnn]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fdattack.data.imageset import ImageSet  # noqa: E402
from fdattack.defenses.dpsgd import DPSGDDefense, DPSGDSettings  # noqa: E402
from fdattack.engine import FitJob, FitResult, LocalTrainer, ModelHandle, default_engine, vectorised  # noqa: E402
from fdattack.engine.malloc import keep_freed_memory  # noqa: E402
from fdattack.lit.classifier import ClassifierLitModule, cross_entropy  # noqa: E402
from fdattack.models import build_classifier  # noqa: E402

IMPLEMENTATIONS = ("opacus", "vmapped")


def clients(engine: LocalTrainer, defense: DPSGDDefense, model: str, k: int, rows: int) -> tuple[list[ModelHandle], list[ImageSet]]:
    """K Adam classifiers of ``model`` (1x28x28 inputs, 10 classes) and their ``rows`` seeded synthetic images each."""
    g = torch.Generator().manual_seed(0)
    handles, sets = [], []
    for client in range(k):
        net = defense.wrap_network(client, build_classifier(model, 1, 28, 10))
        handle = engine.setup(f"client{client}", ClassifierLitModule(net, 10, optimizer="adam", lr=1e-3))
        handle.module.use_objective(cross_entropy)
        handles.append(handle)
        sets.append(ImageSet.from_images(torch.rand(rows, 1, 28, 28, generator=g) * 2 - 1, torch.randint(0, 10, (rows,), generator=g)))
    return handles, sets


def epoch(
    impl: str, engine: LocalTrainer, defense: DPSGDDefense, handles: list[ModelHandle], sets: list[ImageSet], seed: int
) -> list[FitResult]:
    """One local epoch of every client, the defense's DP-SGD jobs, by ``impl``."""
    jobs = [
        defense.wrap_job(k, "local_train", FitJob(h, s, 1, cross_entropy, seed + k), engine.batch_size)
        for k, (h, s) in enumerate(zip(handles, sets))
    ]
    if impl == "opacus":
        return engine.fit_many(jobs)
    return vectorised.fit_private_copies(jobs, engine.batch_size, engine.fabric.device)


def worker(impl: str, k: int, args: argparse.Namespace) -> None:
    keep_freed_memory()
    torch.set_num_threads(1)
    engine = default_engine(batch_size=args.batch_size, vectorise="false" if impl == "opacus" else "true")
    defense = DPSGDDefense(DPSGDSettings(noise_multiplier=1.0, max_grad_norm=10.0), seed=0)
    handles, sets = clients(engine, defense, args.model, k, args.rows)
    epoch(impl, engine, defense, handles, sets, seed=0)  # warm-up
    times, cpu, steps = [], [], []
    for e in range(1, args.epochs + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        results = epoch(impl, engine, defense, handles, sets, seed=1000 * e)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        steps.append([r.steps for r in results])
    print(json.dumps({"times": times, "cpu": cpu, "steps": steps}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per process, after one warm-up epoch")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 10])
    parser.add_argument("--rows", type=int, default=640, help="private images per client")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model", default="pli_cnn")
    parser.add_argument("--worker", nargs=2, metavar=("IMPL", "K"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args)
        return

    times: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    steps: dict[tuple[str, int], list] = {}
    for rep in range(args.repeats):
        for k in args.clients:
            for impl in IMPLEMENTATIONS if rep % 2 == 0 else IMPLEMENTATIONS[::-1]:
                options = [
                    "--epochs",
                    str(args.epochs),
                    "--rows",
                    str(args.rows),
                    "--batch-size",
                    str(args.batch_size),
                    "--model",
                    args.model,
                ]
                proc = subprocess.run(
                    [sys.executable, __file__, *options, "--worker", impl, str(k)],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                    check=True,
                )
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                times.setdefault((impl, k), []).extend(row["times"])
                cpu.setdefault((impl, k), []).extend(row["cpu"])
                steps.setdefault((impl, k), []).append(row["steps"])
    for k in args.clients:
        assert steps[("opacus", k)] == steps[("vmapped", k)], f"K={k}: the implementations took different steps"

    print(
        f"DP-SGD local epochs, {args.model} on {args.rows} 1x28x28 images per client, B = {args.batch_size} (Poisson), "
        f"σ = 1, C = 10, Adam; {args.epochs} epochs x {args.repeats} repeats, 1 thread per process; medians."
    )
    wall, cpu_time = "s/epoch", "CPU s/epoch (opacus / vmapped)"
    print(f"{'K':>4} {'opacus loop ' + wall:>20} {'vmapped ' + wall:>16} {'speed-up':>9} {cpu_time:>31} {'speed-up':>9}")
    for k in args.clients:
        t = {impl: statistics.median(times[(impl, k)]) for impl in IMPLEMENTATIONS}
        c = {impl: statistics.median(cpu[(impl, k)]) for impl in IMPLEMENTATIONS}
        print(
            f"{k:>4} {t['opacus']:>20.3f} {t['vmapped']:>16.3f} {t['opacus'] / t['vmapped']:>8.2f}x "
            f"{c['opacus']:>15.3f} / {c['vmapped']:<13.3f} {c['opacus'] / c['vmapped']:>8.2f}x"
        )


if __name__ == "__main__":
    main()
