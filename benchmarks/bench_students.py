"""Distillation-based LiRA's shadow students (pdafd.md §6.4): K students of one target client, trained as one
vectorised batch through fdattack's engine against one after another in a plain PyTorch loop.

Each student is distilled (L1 to the teacher's logits, Adam 1e-3, batch 64) from a fixed teacher's outputs on its own
random 80 % of the round's public rows, as ``lira_distill`` does. Per (data, K) the script prints the students trained
per minute of the vectorised path (``LocalTrainer.fit_many``, the attack's call), of fdattack's per-model loop
(``trainer.vectorise=false``) and of a plain PyTorch loop written below, the speed-up of the vectorised path over the
plain loop, and each process's peak RSS. Every (data, K, implementation) runs in its own one-thread process,
alternating, median over repeats.

Usage: ``python benchmarks/bench_students.py [--students 8 32] [--epochs 20] [--repeats 3] [--data digits mnist]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fdattack.config import compose  # noqa: E402
from fdattack.data.federated import build_split  # noqa: E402
from fdattack.engine import FitJob, LocalTrainer, make_fabric  # noqa: E402
from fdattack.engine.malloc import keep_freed_memory  # noqa: E402
from fdattack.lit.student import DistillationStudent  # noqa: E402
from fdattack.models import build_classifier  # noqa: E402
from fdattack.randomness import derive_seed  # noqa: E402

torch.set_num_threads(1)
IMPLEMENTATIONS = ("vectorised", "per-model", "plain")
#: (data overrides, public rows per round, network) of each setting
SETTINGS = {
    "digits": (["data=digits", "data.split=random", "data.partition=iid"], 300, "pli_cnn"),
    "mnist": (["data=mnist_pdafd", f"data.root={REPO.parent / 'shared' / 'data' / 'mnist_t10k'}"], 1000, "pli_cnn"),
}
BATCH, FRACTION = 64, 0.8


def public_and_teacher(data: str) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The round's public images and a fixed teacher's logits on them."""
    overrides, rows, arch = SETTINGS[data]
    split = build_split(compose(None, overrides).data, 4, 42)
    images = split.public.images[:rows]
    torch.manual_seed(0)
    with torch.no_grad():
        teacher = build_classifier(arch, images.shape[1], images.shape[2], split.num_classes)(images)
    return images, teacher, arch


def shares(k: int, n: int) -> list[torch.Tensor]:
    """Each student's random 80 % of the rows."""
    return [torch.randperm(n, generator=torch.Generator().manual_seed(i))[: int(FRACTION * n)] for i in range(k)]


def train_fdattack(images: torch.Tensor, teacher: torch.Tensor, arch: str, k: int, epochs: int, vectorise: bool) -> None:
    from fdattack.data.imageset import ImageSet

    engine = LocalTrainer(make_fabric("cpu", 1, "auto", 1, "32-true"), BATCH, vectorise=vectorise)
    public = ImageSet.from_images(images, torch.zeros(len(images), dtype=torch.long))
    jobs = []
    for i, rows in enumerate(shares(k, len(images))):
        torch.manual_seed(i)
        student = DistillationStudent(arch, teacher.shape[1], "l1", in_channels=images.shape[1], image_size=images.shape[2])
        jobs.append(
            FitJob(
                engine.setup(f"student{i}", student), public.subset(rows), epochs, student.objective, derive_seed(i), targets=teacher[rows]
            )
        )
    engine.fit_many(jobs)


def train_plain(images: torch.Tensor, teacher: torch.Tensor, arch: str, k: int, epochs: int) -> None:
    for i, rows in enumerate(shares(k, len(images))):
        torch.manual_seed(i)
        net = build_classifier(arch, images.shape[1], images.shape[2], teacher.shape[1])
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        x, y = images[rows], teacher[rows]
        for _ in range(epochs):
            for idx in torch.split(torch.randperm(len(rows)), BATCH):
                loss = F.l1_loss(net(x[idx]), y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()


def worker(impl: str, data: str, k: int, epochs: int) -> None:
    keep_freed_memory()  # as the fdattack command does, for every implementation alike
    images, teacher, arch = public_and_teacher(data)
    start = time.perf_counter()
    if impl == "plain":
        train_plain(images, teacher, arch, k, epochs)
    else:
        train_fdattack(images, teacher, arch, k, epochs, vectorise=impl == "vectorised")
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--epochs", type=int, default=20, help="student epochs (default: lira_distill's, the authors' 20)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--worker", nargs=3, metavar=("IMPL", "DATA", "K"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        impl, data, k = args.worker
        worker(impl, data, int(k), args.epochs)
        return
    results: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    for _ in range(args.repeats):
        for data in args.data:
            for k in args.students:
                for impl in IMPLEMENTATIONS:
                    proc = subprocess.run(
                        [sys.executable, __file__, "--epochs", str(args.epochs), "--worker", impl, data, str(k)],
                        capture_output=True,
                        text=True,
                        env={**os.environ, "OMP_NUM_THREADS": "1"},
                        check=True,
                        cwd=REPO,
                    )
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
                    entry = results.setdefault((data, impl, k), {"seconds": [], "peak_mb": []})
                    entry["seconds"].append(row["seconds"])
                    entry["peak_mb"].append(row["peak_mb"])
    print(
        f"Shadow students of one target (L1 distillation, batch {BATCH}, {int(FRACTION * 100)} % of the public rows each), "
        f"{args.epochs} epochs, {args.repeats} repeats, 1 thread per process; medians."
    )
    print(
        f"{'data':>6} {'K':>4} {'vectorised st/min':>18} {'per-model st/min':>17} {'plain st/min':>13} {'speed-up vs plain':>18} "
        f"{'peak RSS MB (vec/per-model/plain)':>34}"
    )
    for data in args.data:
        for k in args.students:
            rate = {impl: 60 * k / statistics.median(results[(data, impl, k)]["seconds"]) for impl in IMPLEMENTATIONS}
            rss = "/".join(f"{statistics.median(results[(data, impl, k)]['peak_mb']):.0f}" for impl in IMPLEMENTATIONS)
            print(
                f"{data:>6} {k:>4} {rate['vectorised']:>18.1f} {rate['per-model']:>17.1f} {rate['plain']:>13.1f} "
                f"{rate['vectorised'] / rate['plain']:>17.2f}x {rss:>34}"
            )


if __name__ == "__main__":
    main()
