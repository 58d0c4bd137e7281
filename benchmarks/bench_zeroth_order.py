"""Zeroth-order gradient estimation of the L-Attack (lattack.md §2.3, Eq. 6): victim queries per second.

fdattack's ``forward_difference_gradient`` puts all B·(m + 1) query points of one estimate (x and x + ε·u_i for
every sample and direction) into one victim query, which the victim answers as fdattack's engine answers every
query, in passes of its predict batch size (``predict_logits``, ``--predict-batch``: 512 by default, the engine's;
``--predict-batch 0`` is one pass over all the points); the plain loop does it MAZE's way, one victim call on the B
points x and then one per direction i = 1..m on x + ε·u_i. Both draw the same unit-sphere directions from the same
seed, so their estimates agree up to float rounding (checked before timing, the ``max |diff|`` column). The victim
is a client classifier (``--model``, default ``pdafd_cnn``) on 1×28×28 images with C = 10 outputs, in eval mode,
queried without gradients; the loss is the spec's targeted cross-entropy to c* = 0 on its logits (``logits``) or
−log(q_c* + 1e-8) on what a LabelAvg client sends instead, its top-K labels with β weights through LabelAvg's upload
transform (``labelavg``, the attack's strong mode, §2.6). The process keeps freed memory for reuse as ``fdattack
run`` does (:func:`fdattack.engine.malloc.keep_freed_memory`). Per (answer, m) the two implementations alternate
``--repeats`` times in one process (one thread by default), each timing ``--steps`` estimates after ``--warmup``
untimed ones; the table gives the medians and the ratio fdattack / plain (target: >= 0.8).

Usage: ``python benchmarks/bench_zeroth_order.py [--batch 100] [--m 5 10 20] [--answers logits labelavg] ...``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_inversion import machine, markdown_table  # noqa: E402  (this folder is on the path when run as a script)

from fdattack.defenses import Release  # noqa: E402
from fdattack.defenses.labelavg import LabelAvgUpload, LabelAvgUploadSettings  # noqa: E402
from fdattack.engine import predict_logits  # noqa: E402
from fdattack.engine.malloc import keep_freed_memory  # noqa: E402
from fdattack.functional.zeroth_order import forward_difference_gradient  # noqa: E402
from fdattack.models import build_classifier  # noqa: E402

EPSILON = 0.1  # lattack.md §2.3
TARGET = 0  # c*
IMPLEMENTATIONS = {"fdattack": "fdattack (one query)", "plain": "plain loop (m + 1 calls)"}
Loss = Callable[[Tensor], Tensor]
Estimate = Callable[[Loss, Tensor, int, torch.Generator], Tensor]


def victim_loss(victim: Callable[[Tensor], Tensor], answer: str, k: int) -> Loss:
    """The server's per-sample loss (N,) from what ``victim`` (query points → logits) answers on (N, 1, 28, 28) points."""
    upload = LabelAvgUpload(LabelAvgUploadSettings(k, "beta"), seed=0)
    release = Release(0, 1, "attack", "logits", b"")

    def loss(points: Tensor) -> Tensor:
        with torch.no_grad():
            logits = victim(points)
            if answer == "logits":
                return F.cross_entropy(logits, torch.full((len(points),), TARGET, device=logits.device), reduction="none")
            return -torch.log(upload.transform(logits, release)[:, TARGET] + 1e-8)

    return loss


def fdattack_estimate(loss: Loss, x: Tensor, m: int, generator: torch.Generator) -> Tensor:
    return forward_difference_gradient(loss, x, m, EPSILON, generator)[0]


def plain_estimate(loss: Loss, x: Tensor, m: int, generator: torch.Generator) -> Tensor:
    """Eq. 6 as MAZE writes it: the base loss, then one victim call per direction."""
    b, d = x.shape[0], x[0].numel()
    u = torch.randn(b, m, *x.shape[1:], generator=generator)
    u = (u / u.flatten(2).norm(dim=-1).view(b, m, 1, 1, 1)).to(x.device)
    base = loss(x)
    grad = torch.zeros_like(x)
    for i in range(m):
        grad += (d * (loss(x + EPSILON * u[:, i]) - base) / EPSILON).view(b, 1, 1, 1) * u[:, i]
    return grad / m


ESTIMATES: dict[str, Estimate] = {"fdattack": fdattack_estimate, "plain": plain_estimate}


def queries_per_second(estimate: Estimate, loss: Loss, x: Tensor, m: int, args: argparse.Namespace) -> float:
    """Victim queries (B·(m + 1) per estimate) per second over ``--steps`` estimates after ``--warmup``."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(args.warmup):
        estimate(loss, x, m, generator)
    if args.device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        estimate(loss, x, m, generator)
    if args.device == "cuda":
        torch.cuda.synchronize()
    return args.steps * len(x) * (m + 1) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--batch", type=int, default=100, help="B, generator samples per estimate (the paper's batch)")
    parser.add_argument("--m", type=int, nargs="+", default=[5, 10, 20], help="directions per sample (the paper's values)")
    parser.add_argument(
        "--answers",
        nargs="+",
        choices=("logits", "labelavg"),
        default=["logits", "labelavg"],
        help="what the victim answers: raw logits (FedMD) or LabelAvg's top-K labels",
    )
    parser.add_argument("--top-k", type=int, default=3, help="K of the labelavg answers")
    parser.add_argument("--model", default="pdafd_cnn", help="the victim's classifier registry name")
    parser.add_argument(
        "--predict-batch",
        type=int,
        default=512,
        help="rows per pass of fdattack's victim (the engine's predict batch size); 0 = all in one",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed estimates per measurement")
    parser.add_argument("--warmup", type=int, default=2, help="untimed estimates first")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per implementation, alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the victim runs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    torch.manual_seed(0)
    device = torch.device(args.device)
    net = build_classifier(args.model, 1, 28, 10).to(device).eval()
    x = torch.rand(args.batch, 1, 28, 28, generator=torch.Generator().manual_seed(0)) * 2 - 1
    victims: dict[str, Callable[[Tensor], Tensor]] = {
        "fdattack": lambda points: predict_logits(net, points, device, args.predict_batch or len(points)),
        "plain": lambda points: net(points.to(device)).cpu(),
    }
    rows = []
    for answer in args.answers:
        losses = {impl: victim_loss(victims[impl], answer, args.top_k) for impl in IMPLEMENTATIONS}
        for m in args.m:
            estimates = [ESTIMATES[impl](losses[impl], x, m, torch.Generator().manual_seed(1)) for impl in IMPLEMENTATIONS]
            diff = float((estimates[0] - estimates[1]).abs().max())
            rates: dict[str, list[float]] = {impl: [] for impl in IMPLEMENTATIONS}
            for repeat in range(args.repeats):
                for impl in list(IMPLEMENTATIONS) if repeat % 2 == 0 else list(reversed(IMPLEMENTATIONS)):
                    rates[impl].append(queries_per_second(ESTIMATES[impl], losses[impl], x, m, args))
            fd, plain = (statistics.median(rates[impl]) for impl in IMPLEMENTATIONS)
            rows.append([answer, str(m), str(args.batch * (m + 1)), f"{fd:.0f}", f"{plain:.0f}", f"{fd / plain:.2f}", f"{diff:.1e}"])
    print(
        f"L-Attack zeroth-order estimate (Eq. 6, eps {EPSILON}): victim {args.model} on 1x28x28, C = 10, B = {args.batch}, "
        f"LabelAvg K = {args.top_k}, fdattack's victim in passes of {args.predict_batch or 'all'} rows; {args.steps} timed estimates "
        f"after {args.warmup}, median of {args.repeats} alternating repeats, "
        f"{args.threads} thread(s), {args.device}."
    )
    print(f"Machine: {machine()}" + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""))
    print()
    print(
        markdown_table(
            [
                "answer",
                "m",
                "queries/estimate",
                f"{IMPLEMENTATIONS['fdattack']} q/s",
                f"{IMPLEMENTATIONS['plain']} q/s",
                "ratio (fdattack/plain)",
                "max |diff|",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
