"""fdattack's LDIA side by side with the PDA-FD authors' code (horanshi/Privacy_PDAFD) on the same MNIST split.

For each seed the driver

1. cuts the MNIST test set with fdattack's own data code (``conf/experiment/ldia_lira_fedmd_mnist.yaml`` and the
   scenario's overrides) and writes the split to ``OUT/split_seed<k>.npz``: the public, test and per-client private
   rows of the MNIST t10k set, the public rows of every round (fdattack's ``Protocol.public_rows``), the order of the
   authors' transfer loader and the clients' true label distributions;
2. runs ``fdattack run`` with those overrides in a subprocess (``OUT/fdattack_seed<k>/``) and checks that the run's
   ``partition.json`` is the split in the file;
3. copies the authors' checkout to ``OUT/authors_seed<k>/code``, applies ``authors.patch`` there (CPU, one thread,
   the split file instead of ``partition_data``, the MLP on 784 inputs) and runs their ``main.py`` in a subprocess;
4. scores both sides' LDIA estimates with fdattack's metric (``fdattack.functional.label_distribution.distances``:
   KL(p ‖ p̂), the direction of the authors' ``F.kl_div(log p̂, p, reduction="sum")``) against the split's true
   distributions, and with the authors' ``ldia.py`` (run as a script), and prints a table over the seeds with
   95 % intervals of each metric's kind (``fdattack.statistics.intervals.mean_interval``) and the per-seed paired
   difference with its t interval.

The two sides run one after the other, never at once, each with ``OMP_NUM_THREADS=1`` and one torch thread; wall
time and peak RSS are those of each side's training process (``os.wait4``).

Usage::

    python benchmarks/peers/pdafd/run.py --authors PATH_TO_CHECKOUT --out DIR [--seeds 0 1 2] [--side both]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from fdattack.config import load_config
from fdattack.data.federated import build_split
from fdattack.fd.protocols.base import Protocol
from fdattack.functional.label_distribution import distances, label_proportions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/peers: the drivers' shared helpers
from common import SIDES, check_partition, checkout_commit, fmt, patched_copy, run_child  # noqa: E402

#: the authors' commit the patch applies to
PINNED = "6d327dcaa861a9ab7fd54af75dc79e4c18871604"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
EXPERIMENT = REPO / "conf" / "experiment" / "ldia_lira_fedmd_mnist.yaml"
PATCH = HERE / "authors.patch"
#: fdattack's model name -> the authors' ``--model`` (``models.py``): the same layers
AUTHORS_MODEL = {"mlp": "MLP", "pdafd_cnn": "CNN"}


@dataclass(frozen=True)
class Scenario:
    """What both sides run: FedMD as PDA-FD runs it, at CPU size."""

    clients: int = 10
    alpha: float = 1.0
    #: communication rounds; the authors' ``--num_rounds`` is one more (their round 0 is the transfer phase)
    rounds: int = 5
    public_per_round: int = 512
    #: transfer epochs on the public set and on the private set (the authors use one ``--pre_ep`` for both)
    pre_ep: int = 20
    digest_ep: int = 10
    revisit_ep: int = 5
    lr: float = 1e-3
    batch_size: int = 64
    model: str = "mlp"
    data_root: str = str(REPO.parent / "shared" / "data" / "mnist_t10k")

    def fdattack_overrides(self, seed: int) -> list[str]:
        """``key=value`` overrides of :data:`EXPERIMENT` for this scenario (LDIA only, W&B off)."""
        return [
            "attacks=[ldia]",
            "logger.wandb.mode=disabled",
            "logger.progress=never",
            f"seed={seed}",
            f"data.root={self.data_root}",
            f"data.dirichlet_alpha={self.alpha}",
            f"model.name={self.model}",
            f"protocol.num_clients={self.clients}",
            f"protocol.rounds={self.rounds}",
            f"protocol.public_per_round={self.public_per_round}",
            f"protocol.transfer_public_epochs={self.pre_ep}",
            f"protocol.transfer_private_epochs={self.pre_ep}",
            f"protocol.digest_epochs={self.digest_ep}",
            f"protocol.revisit_epochs={self.revisit_ep}",
            f"protocol.optim.lr={self.lr}",
            f"protocol.optim.batch_size={self.batch_size}",
        ]

    def authors_args(self, seed: int, split_file: Path) -> list[str]:
        """The patched ``main.py``'s arguments for the same run."""
        return [
            *("--dataset", "MNIST", "--alg", "FedMD", "--model", AUTHORS_MODEL[self.model], "--in_features", "784"),
            *("--num_clients", str(self.clients), "--num_classes", "10", "--sampling_rate", "1"),
            *("--num_rounds", str(self.rounds + 1), "--pre_ep", str(self.pre_ep)),
            *("--digest_ep", str(self.digest_ep), "--revisit_ep", str(self.revisit_ep)),
            *("--lr", str(self.lr), "--co_lr", str(self.lr), "--batch_size", str(self.batch_size)),
            *("--digest_batch_size", str(self.batch_size), "--beta", str(self.alpha), "--seed", str(seed)),
            *("--split_file", str(split_file), "--mnist_root", self.data_root, "--threads", "1"),
        ]


# ------------------------------------------------------------------------------------------- the split
def split_arrays(scenario: Scenario, seed: int) -> dict[str, np.ndarray]:
    """fdattack's split for ``seed`` (its own ``build_split`` and ``Protocol.public_rows``) as arrays."""
    cfg = load_config(EXPERIMENT, scenario.fdattack_overrides(seed))
    split = build_split(cfg.data, int(cfg.protocol.num_clients), int(cfg.seed))
    stub = SimpleNamespace(split=split, cfg=cfg.protocol, seed=int(cfg.seed))  # what public_rows reads of a protocol
    rounds = np.stack([Protocol.public_rows(stub, r).numpy() for r in range(1, scenario.rounds + 1)])  # type: ignore[arg-type]
    assert bool((split.test.source >= 0).all()), "the MNIST t10k set has no separate test split: every test row is a pool row"
    return {
        "public": split.public.source.numpy(),
        "test": split.test.source.numpy(),
        "private": np.concatenate([p.source.numpy() for p in split.private]),
        "private_sizes": np.array([len(p) for p in split.private]),
        "public_rounds": rounds,  # positions in `public`, round t in row t - 1
        # the authors' transfer loader does not shuffle: a fixed random order of the whole public set (their rng.choice)
        "transfer_public": np.random.default_rng(seed).permutation(len(split.public)),
        "truth": torch.stack([label_proportions(p.labels, split.num_classes) for p in split.private]).numpy(),
    }


def digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 of the public, test and private rows (what both sides must share)."""
    h = hashlib.sha256()
    for key in ("public", "test", "private", "private_sizes", "public_rounds"):
        h.update(np.ascontiguousarray(arrays[key], dtype=np.int64).tobytes())
    return h.hexdigest()


def write_split(scenario: Scenario, seed: int, path: Path) -> dict[str, np.ndarray]:
    """Write ``split_seed<k>.npz`` (with its digest) and return its arrays."""
    arrays = split_arrays(scenario, seed)
    np.savez(path, **arrays, digest=np.array(digest(arrays)), scenario=np.array(json.dumps(asdict(scenario))))
    return arrays


# ------------------------------------------------------------------------------------------- subprocesses


def prepare_authors(checkout: Path, dest: Path) -> Path:
    """A copy of the authors' checkout at ``dest`` with :data:`PATCH` applied; returns it."""
    return patched_copy(checkout, dest, PATCH, shutil.ignore_patterns(".git"))


def run_ldia_py(script: Path, estimates: torch.Tensor, truth: list[torch.Tensor], where: Path) -> dict:
    """The authors' (patched) ``ldia.py`` on saved files: ``estimates`` (rounds, clients, rows, M) and ``truth``."""
    where.mkdir(parents=True, exist_ok=True)
    torch.save(estimates, where / "label_distribution.pt")
    torch.save(truth, where / "ground_truth.pt")
    cmd = [sys.executable, str(script), "label_distribution.pt", "ground_truth.pt", "ldia.json"]
    run_child(cmd, where, where / "ldia.log")
    return json.loads((where / "ldia.json").read_text())


# ------------------------------------------------------------------------------------------- the sides
def score(truth: np.ndarray, estimates: torch.Tensor) -> dict[str, object]:
    """fdattack's LDIA metric (KL(p ‖ p̂) and Chebyshev per client, as its scorer computes them) and the uniform guess."""
    p = torch.as_tensor(truth, dtype=torch.float64)
    ours = distances(p, estimates.double())
    uniform = distances(p, torch.full_like(p, 1.0 / p.shape[1]))
    return {
        "kl": float(ours["kl"].mean()),
        "kl_clients": ours["kl"].tolist(),
        "chebyshev": float(ours["chebyshev"].mean()),
        "uniform_kl": float(uniform["kl"].mean()),
        "estimates": estimates.tolist(),
    }


def run_fdattack(scenario: Scenario, seed: int, arrays: dict[str, np.ndarray], out: Path, ldia_script: Path) -> dict:
    """``fdattack run`` in a subprocess; its LDIA estimates from the final checkpoint's attack state."""
    run_dir = out / f"fdattack_seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    overrides = [*scenario.fdattack_overrides(seed), f"output_dir={run_dir}"]
    measured = run_child([sys.executable, "-m", "fdattack", "run", str(EXPERIMENT), *overrides], REPO, out / f"fdattack_seed{seed}.log")
    check_partition(run_dir / "partition.json", *(arrays[k] for k in ("public", "test", "private", "private_sizes")))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    state = torch.load(run_dir / "checkpoints" / f"round_{scenario.rounds:04d}.pt", weights_only=True)["attacks"]["ldia"]
    clients = sorted(int(k) for k in state["sums"])
    assert clients == list(range(scenario.clients)) and all(int(n) == scenario.rounds for n in state["counts"].values())
    estimates = torch.stack([state["sums"][str(k)] / state["counts"][str(k)] for k in clients])
    scored = score(arrays["truth"], estimates)
    assert abs(scored["kl"] - metrics["attack/ldia/kl"]) < 1e-9, "the estimates from the checkpoint are not the ones fdattack scored"
    truth = [torch.as_tensor(t, dtype=torch.float32) for t in arrays["truth"]]
    theirs = run_ldia_py(ldia_script, estimates.float()[None, :, None, :], truth, out / "ldia_py" / f"fdattack_seed{seed}")
    return {
        **scored,
        "ldia_py_kl": float(np.mean(theirs["kl"])),
        "ldia_py_kl_clients": theirs["kl"],
        "client_acc": metrics["protocol/client_acc_mean"],
        **asdict(measured),
    }


def run_authors(scenario: Scenario, seed: int, arrays: dict[str, np.ndarray], out: Path, checkout: Path, split_file: Path) -> dict:
    """The patched authors' ``main.py`` in a subprocess, then their ``ldia.py`` on what it saved."""
    work = out / f"authors_seed{seed}"
    if work.exists():
        shutil.rmtree(work)
    code = prepare_authors(checkout, work / "code")  # main.py also writes ../FedMD/: inside work
    measured = run_child([sys.executable, "main.py", *scenario.authors_args(seed, split_file)], code, out / f"authors_seed{seed}.log")
    beta = float(scenario.alpha)
    outputs = torch.load(code / f"FedMD_label_distribution_{beta}.pt")  # (rounds, clients, rows, M): softmax on S_t
    their_truth = torch.load(code / f"FedMDground_truth_distribution_{beta}.pt")
    accuracy = torch.load(code / f"FedMD_client_acc_{beta}.pt")
    assert outputs.shape[:3] == (scenario.rounds, scenario.clients, scenario.public_per_round), tuple(outputs.shape)
    estimates = outputs.double().mean(dim=2).mean(dim=0)  # Eq. 4 per round, then the mean over the rounds (ldia.py)
    theirs = run_ldia_py(code / "ldia.py", outputs, their_truth, out / "ldia_py" / f"authors_seed{seed}")
    truth = torch.as_tensor(arrays["truth"])
    return {
        **score(arrays["truth"], estimates),
        "ldia_py_kl": float(np.mean(theirs["kl"])),
        "ldia_py_kl_clients": theirs["kl"],
        # the authors' ground truth counts a shuffled drop_last loader: a random subset of each client's rows
        "their_truth_max_abs_error": float((torch.stack(their_truth).double() - truth).abs().max()),
        "client_acc": float(accuracy.mean()),
        **asdict(measured),
    }


# ------------------------------------------------------------------------------------------- the table


def table(results: dict[int, dict[str, dict]]) -> str:
    """The side-by-side table over the seeds, the per-seed rows and the paired difference."""
    seeds = sorted(results)
    lines = [
        f"seeds {seeds}; mean [95 % interval over the seeds of each metric's kind; t for differences]",
        "",
        "| side | KL(p‖p̂) fdattack metric | KL ldia.py | Chebyshev | uniform-guess KL | client acc | wall s | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        rows = [results[s][side] for s in seeds if side in results[s]]
        if not rows:
            continue
        kinds = {"ldia_py_kl": "kl", "client_acc": "client_acc_mean"}  # the fdattack metric of each column's kind
        columns = ("kl", "ldia_py_kl", "chebyshev", "uniform_kl", "client_acc")
        cells = [fmt([r[key] for r in rows], key=kinds.get(key, key)) for key in columns]
        cells += [fmt([r[key] for r in rows], 0, key=key) for key in ("wall_s", "peak_rss_mib")]
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    lines += ["", "| seed | uniform KL | KL fdattack | KL authors | fdattack − authors | acc fdattack | acc authors |"]
    lines += ["|---|---|---|---|---|---|---|"]
    paired = [s for s in seeds if all(side in results[s] for side in SIDES)]
    for s in seeds:
        f, a = results[s].get("fdattack"), results[s].get("authors")
        diff = f"{f['kl'] - a['kl']:+.3f}" if f and a else "-"
        uniform = f"{(f or a)['uniform_kl']:.3f}"  # type: ignore[index]
        cells = [uniform] + [f"{r['kl']:.3f}" if r else "-" for r in (f, a)] + [diff]
        cells += [f"{r['client_acc']:.3f}" if r else "-" for r in (f, a)]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    if len(paired) >= 2:
        diffs = [results[s]["fdattack"]["kl"] - results[s]["authors"]["kl"] for s in paired]
        accs = [results[s]["fdattack"]["client_acc"] - results[s]["authors"]["client_acc"] for s in paired]
        lines += ["", f"paired KL difference fdattack − authors: {fmt(diffs)}", f"paired accuracy difference: {fmt(accs)}"]
    return "\n".join(lines)


def load_results(out: Path, seeds: list[int]) -> dict[int, dict[str, dict]]:
    """Every ``result_seed<k>_<side>.json`` under ``out`` for ``seeds``."""
    results: dict[int, dict[str, dict]] = {}
    for s in seeds:
        for side in SIDES:
            path = out / f"result_seed{s}_{side}.json"
            if path.is_file():
                results.setdefault(s, {})[side] = json.loads(path.read_text())
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", type=Path, help=f"checkout of horanshi/Privacy_PDAFD at {PINNED}")
    parser.add_argument("--out", type=Path, required=True, help="where the splits, the runs and the results go")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--side", choices=("both", *SIDES), default="both")
    parser.add_argument("--table-only", action="store_true", help="print the table of the results already in --out, run nothing")
    parser.add_argument("--data-root", default=Scenario.data_root, help="folder of the MNIST t10k IDX files")
    knobs = ("clients", "alpha", "rounds", "public_per_round", "pre_ep", "digest_ep", "revisit_ep", "lr", "batch_size")
    for knob in knobs:  # the scenario's other knobs, defaults as in Scenario
        default = getattr(Scenario, knob)
        parser.add_argument(f"--{knob.replace('_', '-')}", type=type(default), default=default, help=f"(default {default})")
    parser.add_argument("--model", choices=sorted(AUTHORS_MODEL), default=Scenario.model, help="mlp = their MLP, pdafd_cnn = their CNN")
    args = parser.parse_args(argv)
    if args.public_per_round % args.batch_size:  # the authors' upload loader drops a last partial batch (drop_last=True)
        parser.error("--public-per-round must be a multiple of --batch-size, or the authors' side uploads fewer rows")
    if args.clients < 9:  # ldia.py plots clients 3, 8 and 0
        parser.error("--clients must be at least 9: the authors' ldia.py plots clients 3, 8 and 0")
    torch.set_num_threads(1)
    scenario = Scenario(model=args.model, data_root=str(Path(args.data_root).resolve()), **{k: getattr(args, k) for k in knobs})
    out = args.out.resolve()
    if args.table_only:
        print(table(load_results(out, args.seeds)))
        return
    if args.authors is None:
        parser.error("--authors is required (a checkout of the authors' repository)")
    out.mkdir(parents=True, exist_ok=True)
    commit = checkout_commit(args.authors)
    if commit is not None and commit != PINNED:
        print(f"warning: {args.authors} is at {commit}, the patch was written for {PINNED}", file=sys.stderr)
    ldia_script = prepare_authors(args.authors.resolve(), out / "authors_code") / "ldia.py"  # scores fdattack's estimates too
    sides = SIDES if args.side == "both" else (args.side,)
    for seed in args.seeds:
        split_file = out / f"split_seed{seed}.npz"
        arrays = write_split(scenario, seed, split_file)
        print(f"seed {seed}: split {digest(arrays)[:16]} -> {split_file}", flush=True)
        for side in sides:
            if side == "fdattack":
                result = run_fdattack(scenario, seed, arrays, out, ldia_script)
            else:
                result = run_authors(scenario, seed, arrays, out, args.authors.resolve(), split_file)
            (out / f"result_seed{seed}_{side}.json").write_text(json.dumps(result, indent=1))
            print(f"seed {seed} {side}: KL {result['kl']:.3f}, acc {result['client_acc']:.3f}, {result['wall_s']:.0f} s", flush=True)
    text = table(load_results(out, args.seeds))
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
