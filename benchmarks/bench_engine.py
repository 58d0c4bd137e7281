"""FedMD on digits for K = 1, 10, 100, 1000 clients (same total data): fdattack's engine, vectorised and one
client at a time, against a plain loop.

For each K the script builds the real FedMD protocol (``split=random, partition=iid`` so any K works
with the same total data) and times its communication rounds, twice: with ``trainer.vectorise=true``
(the clients train and predict as one ``torch.func.vmap`` batch, :mod:`fdattack.engine.vectorised`) and with
``trainer.vectorise=false`` (the per-client loop). The baseline is a plain PyTorch loop, written below,
that does the same optimizer steps on the same networks and batch sizes: per round, every client
predicts the public set, the logits are averaged, every client takes one L1 epoch on the public set and
one CE epoch on its private set, the server model one CE epoch on the public set, and every model is
scored on its test set (fdattack's per-round utility metrics).

Printed per K: seconds per round (median over rounds and repeats) of the three, the speed-up of the
vectorised path over the per-client loop, the fixed cost per client-phase of the per-client loop
((per-client - plain) / client-phases per round), and the peak RSS of a process that ran each. Each
(K, implementation) runs in its own subprocess, alternating, so the peak memory is per configuration
and machine noise hits all sides alike; every process uses one thread. For reference, the fixed cost
of a ``lightning.Trainer`` per client-phase (what the Fabric design avoids) is printed below the table.

Usage: ``python benchmarks/bench_engine.py [--repeats 3] [--rounds 3] [--clients 1 10 100 1000]``
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
from fdattack.engine.malloc import keep_freed_memory  # noqa: E402
from fdattack.experiment import Experiment  # noqa: E402
from fdattack.fd.orchestrator import RoundOrchestrator  # noqa: E402

torch.set_num_threads(1)


def overrides(k: int, out: Path) -> list[str]:
    return [
        f"output_dir={out}",
        "logger.wandb.mode=disabled",
        "logger.progress=never",
        "evaluation.confidence_gap.enabled=false",
        "attacks=[]",
        f"protocol.num_clients={k}",
        "protocol.transfer_public_epochs=0",
        "protocol.transfer_private_epochs=0",
        "data.split=random",
        "data.partition=iid",
        "data.public_fraction=0.3",
    ]


def client_phases_per_round(k: int) -> int:
    """upload (predict) + digest (K > 1) + revisit per client, plus the server's epoch."""
    return k * (3 if k > 1 else 2) + 1


def time_fdattack(k: int, rounds: int, out: Path, vectorise: bool) -> list[float]:
    exp = Experiment(compose(None, [*overrides(k, out), f"trainer.vectorise={str(vectorise).lower()}"]))
    orchestrator = RoundOrchestrator(exp.protocol, [])
    times = []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        orchestrator.run_round(r)
        exp.evaluator.round_report()  # the per-round utility metrics
        times.append(time.perf_counter() - start)
    return times


def time_plain_loop(k: int, rounds: int, out: Path) -> list[float]:
    """The baseline: the same steps with plain PyTorch (no Lightning, no records, no evaluation)."""
    exp = Experiment(compose(None, overrides(k, out)))
    split, bs = exp.data.split, exp.cfg.protocol.optim.batch_size
    models = [c.module.net for c in exp.protocol.clients]
    server = exp.protocol.server.module.net  # type: ignore[union-attr]
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in models]
    server_opt = torch.optim.Adam(server.parameters(), lr=1e-3)
    public_x, public_y = split.public.images, split.public.labels
    client_tests = [exp.oracle.client_test_set(k) for k in range(len(models))]

    def epoch(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, target: torch.Tensor, loss_fn) -> None:  # type: ignore[no-untyped-def]
        model.train()
        for idx in torch.split(torch.randperm(x.shape[0]), bs):
            loss = loss_fn(model(x[idx]), target[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        with torch.no_grad():
            for m in models:
                m.eval()
            consensus = torch.stack([torch.cat([m(public_x[i : i + 512]) for i in range(0, public_x.shape[0], 512)]) for m in models]).mean(
                0
            )
        for m, opt, private in zip(models, opts, split.private):
            if k > 1:
                epoch(m, opt, public_x, consensus, F.l1_loss)
            epoch(m, opt, private.images, private.labels, F.cross_entropy)
        epoch(server, server_opt, public_x, public_y, F.cross_entropy)
        with torch.no_grad():  # the same utility evaluation fdattack reports every round
            for m, k_test in zip(models, client_tests):
                m.eval()
                (m(k_test.images).argmax(-1) == k_test.labels).float().mean()
            server.eval()
            (server(split.test.images).argmax(-1) == split.test.labels).float().mean()
        times.append(time.perf_counter() - start)
    return times


def trainer_fixed_cost(repeats: int = 20) -> float:
    """Seconds of one ``lightning.Trainer(...).fit`` on a one-batch loader, minus that batch's plain step."""
    import logging
    import warnings

    import lightning as L

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    from fdattack.data.imageset import ImageSet
    from fdattack.lit import ClassifierLitModule
    from fdattack.models import build_classifier

    data = ImageSet.from_images(torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,)))
    samples = []
    for _ in range(repeats):
        module = ClassifierLitModule(build_classifier("pli_cnn", 1, 8, 10), 10)
        start = time.perf_counter()
        trainer = L.Trainer(
            max_epochs=1,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module, data.loader(64))
        samples.append(time.perf_counter() - start)
    module = ClassifierLitModule(build_classifier("pli_cnn", 1, 8, 10), 10)  # not attached to a Trainer: its steps log nothing
    opt = module.configure_optimizers()
    batch = data.batch(torch.arange(32))
    start = time.perf_counter()
    for _ in range(repeats):
        loss = module.training_step(batch, 0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    plain = (time.perf_counter() - start) / repeats
    return statistics.median(samples) - plain


IMPLEMENTATIONS = ("vectorised", "per-client", "plain")


def worker(impl: str, k: int, rounds: int, out: Path) -> None:
    keep_freed_memory()  # as the fdattack command does, for every implementation alike
    times = time_plain_loop(k, rounds, out) if impl == "plain" else time_fdattack(k, rounds, out, vectorise=impl == "vectorised")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"times": times, "peak_mb": peak_mb}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--worker", nargs=3, metavar=("IMPL", "K", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        impl, k, out = args.worker
        worker(impl, int(k), args.rounds, Path(out))
        return

    import tempfile

    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for k in args.clients:
                for impl in IMPLEMENTATIONS:
                    out = Path(tmp) / f"{impl}-{k}-{rep}"
                    proc = subprocess.run(
                        [sys.executable, __file__, "--rounds", str(args.rounds), "--worker", impl, str(k), str(out)],
                        capture_output=True,
                        text=True,
                        env={**os.environ, "OMP_NUM_THREADS": "1"},
                        check=True,
                    )
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
                    entry = results.setdefault((impl, k), {"times": [], "peak_mb": []})
                    entry["times"] += row["times"]
                    entry["peak_mb"].append(row["peak_mb"])
    trainer_cost = trainer_fixed_cost()

    print(f"FedMD on digits, same total data, {args.rounds} rounds x {args.repeats} repeats, 1 thread per process; medians.")
    print(
        f"{'K':>5} {'vectorised s/round':>19} {'per-client s/round':>19} {'plain s/round':>14} {'speed-up':>9} "
        f"{'fixed cost/client-phase':>24} {'peak RSS MB (vec/per-client/plain)':>35}"
    )
    for k in args.clients:
        t = {impl: statistics.median(results[(impl, k)]["times"]) for impl in IMPLEMENTATIONS}
        rss = "/".join(f"{statistics.median(results[(impl, k)]['peak_mb']):.0f}" for impl in IMPLEMENTATIONS)
        fixed = (t["per-client"] - t["plain"]) / client_phases_per_round(k)
        print(
            f"{k:>5} {t['vectorised']:>19.4f} {t['per-client']:>19.4f} {t['plain']:>14.4f} {t['per-client'] / t['vectorised']:>8.2f}x "
            f"{fixed * 1e3:>21.2f} ms {rss:>35}"
        )
    print(f"A lightning.Trainer per client-phase would add {trainer_cost * 1e3:.1f} ms (its fixed cost, what the Fabric engine avoids).")


if __name__ == "__main__":
    main()
