"""Inversion-network benchmarks of PLI: fdattack's training step against a plain PyTorch loop.

``throughput``: images per second of one inversion-training step (pli.md §7.2, Eq. 3) done the way
fdattack does it (an ``InversionLitModule`` set up on the Fabric engine, one ``LocalTrainer.fit_module``
call per epoch driving its ``training_step``, as ``PLIAttack`` trains) and the way a plain loop does it (``InversionDecoder`` + ``torch.optim.Adam`` +
``F.mse_loss``, the prior term added by hand), on the same network, synthetic data and batches:
J classes → input 2J ([p0, pk]), C×S×S images, batch 8 and max_width 1024 as in the paper. Each
(implementation, repeat) runs in its own subprocess, alternating, so machine noise hits both alike;
the table gives the median over repeats and the ratio fdattack / plain (target: >= 0.9). Each worker
imports only what its implementation needs (start-up is never timed, but it is most of the wall time).

``memory``: peak resident memory of whole PLI rounds (every client's Eq. 3 + Eq. 10 training, Eq. 7
reconstruction and Eq. 11 selection) with K clients at J classes and C×S×S images, with the clients'
networks persisted on disk between rounds (fdattack's run directories) and, for contrast, kept in memory.
Target: peak at K = 10 within 1.5x the peak at K = 1 with the disk store.

Usage: ``python benchmarks/bench_inversion.py throughput [--classes 1000] [--image-size 64] [--steps 20] ...``
       ``python benchmarks/bench_inversion.py memory [--clients 1 10] [--classes 1000] [--image-size 64] ...``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from fdattack.models.inversion import InversionDecoder

IMPLEMENTATIONS = {
    "fdattack": "fdattack (InversionLitModule through the Fabric engine)",
    "plain": "plain (InversionDecoder + Adam + F.mse_loss)",
}
LR, WEIGHT_DECAY = 3e-5, 1e-4  # pli.md §7.8

Train = Callable[[list[dict[str, Tensor]]], None]


# ------------------------------------------------------------------------------------ shared helpers
def machine() -> str:
    """One line naming the machine the numbers come from."""
    return f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table, the first column left-aligned and the others right-aligned."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join([":---"] + ["---:"] * (len(headers) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def run_worker(argv: list[str], threads: int) -> dict:
    """Run this script with ``argv`` in a fresh process; its last stdout line is a JSON object."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {argv} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ throughput
def synthetic_batches(args: argparse.Namespace, count: int) -> list[dict[str, Tensor]]:
    """PLI's Eq. 3 batches: tempered probability pairs [p0, pk] (B, 2J), images and the prior (B, C, S, S)."""
    generator = torch.Generator().manual_seed(0)
    b, j, c, s = args.batch_size, args.classes, args.channels, args.image_size
    prior = torch.rand(1, c, s, s, generator=generator) * 2 - 1
    batches = []
    for _ in range(count):
        logits = torch.randn(b, 2, j, generator=generator)
        inputs = torch.softmax(logits / 3.0, dim=-1).reshape(b, 2 * j)
        images = torch.rand(b, c, s, s, generator=generator) * 2 - 1
        batches.append({"input": inputs, "x": images, "prior": prior.expand(b, -1, -1, -1)})
    return batches


def decoder(args: argparse.Namespace) -> InversionDecoder:
    """The paper's G for these sizes, seeded so both implementations start from the same weights."""
    from fdattack.models.inversion import InversionDecoder

    torch.manual_seed(0)
    return InversionDecoder(2 * args.classes, args.channels, args.image_size, args.max_width)


def fdattack_training(args: argparse.Namespace) -> Train:
    """What ``PLIAttack`` does per epoch: one engine call over the rows, the module's own ``training_step``."""
    from fdattack.fd.engine import TensorRows, default_engine
    from fdattack.lit.inversion import InversionLitModule

    engine = default_engine(args.batch_size)
    handle = engine.setup("inversion", InversionLitModule(decoder(args), LR, WEIGHT_DECAY, args.gamma))

    def train(batches: list[dict[str, Tensor]]) -> None:
        rows = TensorRows(**{key: torch.cat([b[key] for b in batches]) for key in batches[0]})
        engine.fit_module(handle, rows, 1, 0, batch_size=args.batch_size, shuffle=False)

    return train


def plain_training(args: argparse.Namespace) -> Train:
    """The same steps written by hand."""
    net = decoder(args)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    net.train()

    def train(batches: list[dict[str, Tensor]]) -> None:
        for batch in batches:
            out = net(batch["input"])
            loss = F.mse_loss(out, batch["x"])
            if args.gamma > 0:
                loss = loss + args.gamma * F.mse_loss(out, batch["prior"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    return train


def throughput_worker(args: argparse.Namespace) -> None:
    """Time ``--steps`` steps after ``--warmup`` untimed ones; print images/s as JSON."""
    torch.set_num_threads(args.threads)
    train = (fdattack_training if args.worker == "fdattack" else plain_training)(args)
    batches = synthetic_batches(args, args.warmup + args.steps)
    train(batches[: args.warmup])
    start = time.perf_counter()
    train(batches[args.warmup :])
    elapsed = time.perf_counter() - start
    print(json.dumps({"images_per_s": args.steps * args.batch_size / elapsed}))


def throughput_flags(args: argparse.Namespace) -> list[str]:
    """The sizes as command-line flags, to hand to a worker."""
    names = ("classes", "image_size", "channels", "batch_size", "max_width", "gamma", "steps", "warmup", "threads")
    return [item for name in names for item in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]


def throughput(args: argparse.Namespace) -> None:
    """Alternate the implementations in subprocesses, ``--repeats`` times; print the table."""
    if args.worker:
        throughput_worker(args)
        return
    samples: dict[str, list[float]] = {impl: [] for impl in IMPLEMENTATIONS}
    for _ in range(args.repeats):
        for impl in IMPLEMENTATIONS:
            row = run_worker(["throughput", *throughput_flags(args), "--worker", impl], args.threads)
            samples[impl].append(row["images_per_s"])
    medians = {impl: statistics.median(values) for impl, values in samples.items()}
    rows = [[label, f"{medians[impl]:.1f}", f"{medians[impl] / medians['plain']:.2f}"] for impl, label in IMPLEMENTATIONS.items()]
    print(f"Inversion training (Eq. 3, gamma {args.gamma}): J = {args.classes} (input {2 * args.classes}), "
          f"{args.channels}x{args.image_size}x{args.image_size}, batch {args.batch_size}, max_width {args.max_width}; "
          f"{args.steps} timed steps after {args.warmup}, median of {args.repeats} repeats, {args.threads} thread(s) per process.")
    print(f"Machine: {machine()}")
    print()
    print(markdown_table(["implementation", "images/s", "ratio (fdattack/plain)"], rows))


def add_throughput_parser(subparsers: argparse._SubParsersAction) -> None:
    """The ``throughput`` subcommand (each measurement is a subcommand with its own ``add_*_parser``)."""
    p = subparsers.add_parser("throughput", help="images/s of inversion training, fdattack against a plain loop")
    p.add_argument("--classes", type=int, default=1000, help="J; the network's input is 2J (default 1000, LFW/LAG)")
    p.add_argument("--image-size", type=int, default=64, help="side S of the images (default 64)")
    p.add_argument("--channels", type=int, default=3, help="C (default 3)")
    p.add_argument("--batch-size", type=int, default=8, help="inversion batch size (default 8, the paper)")
    p.add_argument("--max-width", type=int, default=1024, help="widest feature map (default 1024, the paper)")
    p.add_argument("--gamma", type=float, default=0.03, help="prior weight; > 0 adds the prior MSE term (default 0.03)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per process (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--repeats", type=int, default=3, help="processes per implementation (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--worker", choices=sorted(IMPLEMENTATIONS), help=argparse.SUPPRESS)
    p.set_defaults(func=throughput)


# ------------------------------------------------------------------------------------ memory
def peak_rss_mb() -> float:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_worker(args: argparse.Namespace) -> None:
    """Run ``--rounds`` PLI rounds on synthetic public data and fake client outputs; print peak RSS as JSON."""
    from fdattack.attacks.base import AttackContext
    from fdattack.attacks.pli import PLIAttack, PLISettings
    from fdattack.attacks.priors import PriorKind, PriorSettings
    from fdattack.attacks.state_store import ClientStateStore
    from fdattack.data.imageset import ImageSet
    from fdattack.fd.record import PublicQuery, RoundRecord
    from fdattack.fd.threat import AttackerView, ThreatModel

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    n, j, c, s = args.public, args.classes, args.channels, args.image_size
    public = ImageSet.from_images(torch.rand(n, c, s, s, generator=g) * 2 - 1, torch.arange(n) % j, torch.zeros(n, dtype=torch.long))
    threat = ThreatModel("server", "logits", public_labels_known=True, query_rows="public")
    view = AttackerView(threat, "fedmd", public, tuple(range(args.targets)), j, (c, s, s), has_server_model=True)
    clients = tuple(range(args.worker_clients))

    def answer(model: int | str, rows: Tensor) -> Tensor:
        seed = 10_007 if model == "server" else int(model)
        return torch.randn(n, j, generator=torch.Generator().manual_seed(seed))[rows]

    settings = PLISettings(max_width=args.max_width, epochs_per_round=1, batch_size=args.batch_size, prior=PriorSettings(kind=PriorKind.naive))
    baseline = peak_rss_mb()
    with tempfile.TemporaryDirectory() as folder:
        store = ClientStateStore(Path(folder) if args.store == "disk" else None)
        attack = PLIAttack(view, settings, AttackContext(seed=0, store=store))
        started = time.perf_counter()
        for round in range(1, args.rounds + 1):
            query = PublicQuery(answer, round, "server_train", torch.arange(n), clients, has_server=True)
            attack.on_record(RoundRecord(round=round, phase="server_train", protocol="fedmd", participants=clients, attack_point=True, query=query))
            query.close()
            attack.on_round_end(round)
        elapsed = time.perf_counter() - started
    print(json.dumps({"peak_mb": peak_rss_mb(), "baseline_mb": baseline, "seconds": elapsed}))


def memory(args: argparse.Namespace) -> None:
    """One subprocess per (store, K); print the table with each K's peak relative to K = 1."""
    if args.worker:
        memory_worker(args)
        return
    flags = ["--classes", str(args.classes), "--image-size", str(args.image_size), "--channels", str(args.channels),
             "--max-width", str(args.max_width), "--batch-size", str(args.batch_size), "--public", str(args.public),
             "--targets", str(args.targets), "--rounds", str(args.rounds), "--threads", str(args.threads)]
    rows, first = [], {}
    for store in ("disk", "memory"):
        for k in args.clients:
            result = run_worker(["memory", *flags, "--store", store, "--worker-clients", str(k), "--worker", "yes"], args.threads)
            first.setdefault(store, result["peak_mb"])
            rows.append([store, str(k), f"{result['peak_mb']:.0f}", f"{result['peak_mb'] - result['baseline_mb']:.0f}",
                         f"{result['peak_mb'] / first[store]:.2f}", f"{result['seconds']:.0f}"])
    print(f"PLI rounds: J = {args.classes}, {args.channels}x{args.image_size}x{args.image_size}, max_width {args.max_width}, "
          f"|D_0| = {args.public}, {args.targets} targets, {args.rounds} rounds, batch {args.batch_size}, {args.threads} thread(s).")
    print(f"Machine: {machine()}")
    print()
    print(markdown_table(["client store", "K", "peak RSS MB", "attack's share MB", f"ratio to K = {args.clients[0]}", "s"], rows))


def add_memory_parser(subparsers: argparse._SubParsersAction) -> None:
    """The ``memory`` subcommand."""
    p = subparsers.add_parser("memory", help="peak memory of PLI rounds against the number of clients K")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 10], help="values of K; the first is the reference (default 1 10)")
    p.add_argument("--classes", type=int, default=1000, help="J (default 1000)")
    p.add_argument("--image-size", type=int, default=64, help="side S of the images (default 64)")
    p.add_argument("--channels", type=int, default=3, help="C (default 3)")
    p.add_argument("--max-width", type=int, default=1024, help="widest feature map (default 1024, the paper)")
    p.add_argument("--batch-size", type=int, default=8, help="inversion batch size (default 8)")
    p.add_argument("--public", type=int, default=16, help="|D_0|, sensitive public images (default 16)")
    p.add_argument("--targets", type=int, default=16, help="target labels reconstructed (default 16)")
    p.add_argument("--rounds", type=int, default=2, help="rounds; the second reloads every client's network (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--store", choices=("disk", "memory"), default="disk", help=argparse.SUPPRESS)
    p.add_argument("--worker-clients", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.set_defaults(func=memory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_throughput_parser(subparsers)
    add_memory_parser(subparsers)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
