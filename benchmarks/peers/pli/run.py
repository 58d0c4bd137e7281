"""fdattack's PLI side by side with the PLI authors' code (FLAIR-THU/PairedLogitsInversion) on the same AT&T split.

For each seed the driver

1. cuts the AT&T faces with fdattack's own data code (``conf/experiment/pli_fedmd_att_faces.yaml`` and the
   scenario's overrides) and writes the split to ``OUT/split_seed<k>.npz``: the public images (D_0: clean faces of the
   non-target identities; D_a: blurred faces of every identity) with their labels and looks, each client's private
   set, the test set and the owner of every target label, all as fdattack's float tensors in [-1, 1]. With
   ``--gamma > 0`` it also trains fdattack's learned prior (``fdattack.attacks.priors.build_prior`` on the attacker's
   view, with the run's attacker seed and engine) and writes it to ``OUT/prior_seed<k>.pt``;
2. runs ``fdattack run`` with those overrides in a subprocess (``OUT/fdattack_g<gamma>_seed<k>/``), checks that the
   run's ``partition.json`` is the split in the file and that the prior the run trained is the tensor in the file;
3. copies the authors' checkout to ``OUT/authors_g<gamma>_seed<k>/code``, applies ``authors.patch`` there (CPU, one
   thread, the split file, the prior file instead of their CycleGAN / DeblurGAN, 32 px networks) and runs their
   ``script/main.py`` in a subprocess with ``--authors-python`` (an environment with cv2, pandas and scikit-image);
4. scores both sides' final reconstructions (round T, chosen by each side's own Eq. 11) with fdattack's scorer
   (``ReconstructionScorer.measure``: the paper's SSIM nearest-mean attack accuracy, pli.md §10), and reads each side's
   per-client candidates to say how often Eq. 11 picked the label's owner and how well the owners' candidates score.
   It prints a table over the seeds with 95 % intervals of each metric's kind
   (``fdattack.statistics.intervals.mean_interval``) and the per-seed paired differences with their t intervals.

The two sides run one after the other, never at once, each with ``OMP_NUM_THREADS=1`` and one torch thread; wall
time and peak RSS are those of each side's process (``os.wait4``).

Usage::

    python benchmarks/peers/pli/run.py --authors PATH_TO_CHECKOUT --authors-python VENV/bin/python --out DIR \\
        [--seeds 0 1 2] [--gamma 0.3] [--side both]
"""

from __future__ import annotations

import argparse
import ast
import json
import pickle
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fdattack.assembly import attacker_seed, known_degradation
from fdattack.attacks.pli import PLIAttack, select_reconstructions
from fdattack.attacks.pli_inputs import optimal_inputs
from fdattack.attacks.priors import build_prior
from fdattack.config import load_config
from fdattack.data.federated import FederatedSplit, build_split
from fdattack.engine import LocalTrainer
from fdattack.engine.trainer import make_fabric
from fdattack.evaluation.reconstruction import ReconstructionScorer
from fdattack.fd.protocols.base import PROTOCOLS
from fdattack.fd.threat import attacker_view
from fdattack.lit.inversion import InversionLitModule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/peers: the drivers' shared helpers
from common import SIDES, check_partition, checkout_commit, digest, fmt, patched_copy, run_child  # noqa: E402

#: the authors' commit the patch applies to (their only commit)
PINNED = "ad9c38e527b7703ba9d820dc60dc682de4d3339c"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
EXPERIMENT = REPO / "conf" / "experiment" / "pli_fedmd_att_faces.yaml"
PATCH = HERE / "authors.patch"
#: Eq. 11's TV weight: the authors' ``evaluation_full_multi_models(beta=0.1)`` default, not on their command line
BETA = 0.1


@dataclass(frozen=True)
class Scenario:
    """What both sides run: ``pli_fedmd_att_faces`` (FedMD with the server model f_0, K = 4, T = 5) at CPU size."""

    clients: int = 4
    rounds: int = 5
    #: prior weight (Eqs. 3 and 10); 0 trains no prior on either side
    gamma: float = 0.0
    tau: float = 3.0
    alpha: float = 5.0
    lr: float = 1e-3
    epochs_per_round: int = 10
    #: 1024 makes both sides' G the paper's InvCNN without its first stage at 32 px (512-256-128)
    max_width: int = 1024
    #: epochs of fdattack's translation model A_phi for the learned prior (only with gamma > 0)
    prior_epochs: int = 30
    #: the authors' side builds p-hat^0 per row (Eq. 6, as fdattack) instead of their batch-wide p_j (a diagnostic)
    authors_per_row_p0: bool = False
    data_root: str = str(REPO.parent / "shared" / "data" / "att_faces")

    @property
    def tag(self) -> str:
        """The cell's name in fdattack's file names, e.g. ``g0.3``."""
        return f"g{self.gamma:g}"

    def tag_of(self, side: str) -> str:
        """The cell's name in ``side``'s file names: the authors' diagnostic variant gets a suffix, fdattack's run is the same."""
        return self.tag + ("_rowp0" if side == "authors" and self.authors_per_row_p0 else "")

    def fdattack_overrides(self, seed: int) -> list[str]:
        """``key=value`` overrides of :data:`EXPERIMENT` for this scenario (PLI only, no evaluation classifier, W&B off)."""
        return [
            "attacks=[pli]",
            "logger.wandb.mode=disabled",
            "logger.progress=never",
            f"seed={seed}",
            f"data.root={self.data_root}",
            f"protocol.num_clients={self.clients}",
            f"protocol.rounds={self.rounds}",
            f"attack.pli.gamma={self.gamma}",
            f"attack.pli.tau={self.tau}",
            f"attack.pli.alpha={self.alpha}",
            f"attack.pli.beta={BETA}",
            f"attack.pli.lr={self.lr}",
            "attack.pli.weight_decay=1e-4",
            "attack.pli.batch_size=8",
            f"attack.pli.epochs_per_round={self.epochs_per_round}",
            f"attack.pli.max_width={self.max_width}",
            # gamma = 0 uses no prior: the naive one costs nothing, the learned one would train A_phi for nothing
            f"attack.pli.prior.kind={'learned' if self.gamma > 0 else 'naive'}",
            f"attack.pli.prior.epochs={self.prior_epochs}",
            "evaluation.classifier=null",
            "evaluation.confidence_gap.enabled=false",
        ]

    def authors_args(self, seed: int, split_file: Path, prior_file: Path | None, output: Path, num_classes: int, targets: int) -> list[str]:
        """The patched ``script/main.py``'s arguments for the same run."""
        args = [
            *("-t", "FedMD", "-d", "ATT", "-a", "pli", "-b", "2", "--use_multi_models", "1", "--data_for_inversion", "1"),
            *("-c", str(self.clients), "--num_communication", str(self.rounds), "--random_seed", str(seed)),
            *("--tot_class_num", str(num_classes), "--tar_class_num", str(targets)),
            *("-s", str(self.tau), "--alpha", str(self.alpha), "--gamma", str(self.gamma)),
            *("--inv_learning_rate", str(self.lr), "--inv_epoch", str(self.epochs_per_round)),
            *("--inv_max_width", str(self.max_width), "--num_workers", "0", "--threads", "1"),
            *("--split_file", str(split_file), "-o", str(output)),
        ]
        args += ["--per_row_server_input", "1"] if self.authors_per_row_p0 else []
        return args + (["--prior_file", str(prior_file)] if prior_file is not None else [])


# ------------------------------------------------------------------------------------------- the split and the prior
def fdattack_config(scenario: Scenario, seed: int) -> DictConfig:
    """The resolved fdattack configuration of this scenario and seed."""
    return load_config(EXPERIMENT, scenario.fdattack_overrides(seed))


def split_arrays(split: FederatedSplit) -> dict[str, np.ndarray]:
    """The split as the arrays both sides read (images as fdattack holds them: float32, (C, H, W), [-1, 1])."""
    targets = sorted(split.owner)
    return {
        "public_images": split.public.images.numpy(),
        "public_labels": split.public.labels.numpy(),
        "public_domain": split.public.domain.numpy(),  # 0 = D_0 (sensitive look), 1 = D_a (blurred)
        "public_source": split.public.source.numpy(),
        "private_images": torch.cat([p.images for p in split.private]).numpy(),
        "private_labels": torch.cat([p.labels for p in split.private]).numpy(),
        "private_source": torch.cat([p.source for p in split.private]).numpy(),
        "private_sizes": np.array([len(p) for p in split.private]),
        "test_images": split.test.images.numpy(),
        "test_labels": split.test.labels.numpy(),
        "test_source": split.test.source.numpy(),
        "targets": np.array(targets),
        "owners": np.array([split.owner[j] for j in targets]),
        "num_classes": np.array(split.num_classes),
    }


def write_split(scenario: Scenario, split: FederatedSplit, path: Path) -> dict[str, np.ndarray]:
    """Write ``split_seed<k>.npz`` (with its digest) and return its arrays."""
    arrays = split_arrays(split)
    np.savez(path, **arrays, digest=np.array(digest(arrays)), scenario=np.array(json.dumps(asdict(scenario))))
    return arrays


def learned_prior(cfg: DictConfig, split: FederatedSplit) -> torch.Tensor:
    """fdattack's prior (J, C, H, W) as its PLI run builds it: ``build_prior`` on PLI's view of the split with the
    run's attacker seed and an engine like the run's attack engine (``Experiment._build``)."""
    protocol = PROTOCOLS.get(cfg.protocol.name)
    view = attacker_view(split, protocol.threat_model, cfg.protocol.name, True, known_degradation(cfg)).for_attack("pli", PLIAttack.reads)
    settings = OmegaConf.to_object(cfg.attack.pli).prior.resolved(view)  # type: ignore[union-attr]
    t = cfg.trainer
    engine = LocalTrainer(
        make_fabric(t.accelerator, t.devices, t.strategy, t.num_nodes, t.precision),
        batch_size=cfg.protocol.optim.batch_size,
        vectorise=t.vectorise,
    )
    return build_prior(view, settings, attacker_seed(cfg.seed), engine)


# ------------------------------------------------------------------------------------------- subprocesses


def skipped(checkout: Path, folder: Path, names: list[str]) -> list[str]:
    """What :func:`prepare_authors` leaves out: ``.git``, and the top-level ``model/`` (the translation models' weights,
    hundreds of MB, unused here), ``materials/`` and ``img/``."""
    top = folder.resolve() == checkout.resolve()
    return [n for n in names if n == ".git" or (top and n in ("model", "materials", "img"))]


def prepare_authors(checkout: Path, dest: Path) -> Path:
    """A copy of the authors' checkout at ``dest`` with :data:`PATCH` applied; returns it."""
    return patched_copy(checkout, dest, PATCH, lambda folder, names: skipped(checkout, Path(folder), names))


# ------------------------------------------------------------------------------------------- the sides
def score(
    scorer: ReconstructionScorer, candidates: torch.Tensor, choice: torch.Tensor, targets: torch.Tensor, owners: torch.Tensor
) -> dict:
    """fdattack's metrics of the chosen reconstructions and of the owners' candidates.

    Args:
        candidates: (K, T, C, H, W) every client's reconstruction of every target.
        choice: (T,) the client Eq. 11 chose for each target.
        targets, owners: (T,) the target labels and the clients that own them.

    ``owner_pick`` is the fraction of targets for which Eq. 11 chose the owner; ``owner_accuracy`` is the accuracy
    an oracle selection (always the owner) would give.
    """
    columns = torch.arange(len(targets))
    metrics, _ = scorer.measure(candidates[choice, columns], targets)
    owner_metrics, _ = scorer.measure(candidates[owners, columns], targets)
    return {
        "accuracy": metrics["accuracy"],
        "ssim": metrics["ssim"],
        "ssim_standard": metrics["ssim_standard"],
        "too_close_to_public": metrics["too_close_to_public"],
        "owner_pick": float(np.mean((choice == owners).numpy())),
        "owner_accuracy": owner_metrics["accuracy"],
        "owner_ssim": owner_metrics["ssim"],
    }


def fdattack_candidates(run_dir: Path, scenario: Scenario, split: FederatedSplit, targets: torch.Tensor) -> torch.Tensor:
    """Every client's reconstruction of every target (K, T, C, H, W) from the final round's stored inversion networks."""
    inputs = optimal_inputs(targets, split.num_classes, scenario.alpha)
    state_dir = run_dir / "attack_state" / "pli" / f"round_{scenario.rounds:04d}"
    candidates = []
    for k in range(scenario.clients):
        state = torch.load(state_dir / f"client_{k}.pt", weights_only=True)
        c, _, s = split.image_shape
        module = InversionLitModule(in_features=2 * split.num_classes, out_channels=c, image_size=s, max_width=scenario.max_width)
        module.load_state_dict(state["model"])
        candidates.append(module.reconstruct(inputs))
    return torch.stack(candidates)


def run_fdattack(
    scenario: Scenario, seed: int, split: FederatedSplit, arrays: dict[str, np.ndarray], prior: torch.Tensor | None, out: Path
) -> dict:
    """``fdattack run`` in a subprocess; its final reconstructions from the round-T artifact, re-scored here."""
    run_dir = out / f"fdattack_{scenario.tag}_seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    overrides = [*scenario.fdattack_overrides(seed), f"output_dir={run_dir}"]
    measured = run_child([sys.executable, "-m", "fdattack", "run", str(EXPERIMENT), *overrides], REPO, out / f"{run_dir.name}.log")
    check_partition(run_dir / "partition.json", *(arrays[k] for k in ("public_source", "test_source", "private_source", "private_sizes")))
    if prior is not None:
        state = torch.load(run_dir / "checkpoints" / f"round_{scenario.rounds:04d}.pt", weights_only=True)["attacks"]["pli"]
        assert torch.equal(state["prior"], prior), "the prior fdattack's run trained is not the one in the prior file"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    final = torch.load(run_dir / "artifacts" / f"pli_reconstructions_round_{scenario.rounds:04d}.pt", weights_only=True)
    targets, owners = torch.as_tensor(arrays["targets"]), torch.as_tensor(arrays["owners"])
    assert torch.equal(final["labels"], targets), "fdattack's reconstructions are not in target order"
    candidates = fdattack_candidates(run_dir, scenario, split, targets)
    choice = select_reconstructions(candidates, BETA)
    assert torch.allclose(candidates[choice, torch.arange(len(targets))], final["images"], atol=1e-5), "rebuilt candidates differ"
    scored = score(ReconstructionScorer(split), candidates, choice, targets, owners)
    assert abs(scored["accuracy"] - metrics["attack/pli/accuracy"]) < 1e-9, "the artifact is not what fdattack scored"
    return {**scored, "client_acc": metrics["protocol/client_acc_mean"], **asdict(measured)}


def authors_outputs(run_dir: Path, scenario: Scenario, targets: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every client's candidates (K, T, C, H, W) of round T and the client their Eq. 11 chose per target (T,), checked
    against the chosen images they saved."""
    choice = torch.tensor([int(np.load(run_dir / f"best_client_{j}.npy")) for j in targets])
    chosen = torch.stack([torch.from_numpy(np.load(run_dir / f"best_raw_{j}.npy")) for j in targets])
    candidates = torch.stack(
        [
            torch.stack([torch.from_numpy(np.load(run_dir / f"{scenario.rounds}_{k}_{j}_pli.npy")) for j in targets])
            for k in range(scenario.clients)
        ]
    )
    assert torch.equal(candidates[choice, torch.arange(len(targets))], chosen), "best_client_<j> does not name best_raw_<j>'s client"
    return candidates, choice


def their_result(run_dir: Path) -> dict:
    """The authors' own evaluation (``result.txt``: success count, too_close_to_public, SSIM and MSE means)."""
    text = (run_dir / "result.txt").read_text()
    return {k: float(v) for k, v in ast.literal_eval(text).items()}


def run_authors(
    scenario: Scenario,
    seed: int,
    split: FederatedSplit,
    arrays: dict[str, np.ndarray],
    files: tuple[Path, Path | None],
    out: Path,
    checkout: Path,
    python: str,
) -> dict:
    """The patched authors' ``script/main.py`` in a subprocess; their chosen reconstructions scored by fdattack."""
    work = out / f"authors_{scenario.tag_of('authors')}_seed{seed}"
    if work.exists():
        shutil.rmtree(work)
    code = prepare_authors(checkout, work / "code")
    (work / "run").mkdir()
    targets = [int(j) for j in arrays["targets"]]
    args = scenario.authors_args(seed, *files, work / "run", split.num_classes, len(targets))
    env = {"PYTHONPATH": str(code / "src"), "MPLBACKEND": "Agg"}
    measured = run_child([python, "script/main.py", *args], code, out / f"{work.name}.log", env)
    (run_dir,) = [p for p in (work / "run").iterdir() if p.is_dir()]  # main.py names it <date>_<random>_ATT_FedMD_<K>
    candidates, choice = authors_outputs(run_dir, scenario, targets)
    theirs = their_result(run_dir)
    with (run_dir / "fedkd_result.pkl").open("rb") as f:
        accuracy = pickle.load(f)["acc_val"][-1]["clients_score"]  # every client on the test set after round T
    scored = score(ReconstructionScorer(split), candidates, choice, torch.as_tensor(targets), torch.as_tensor(arrays["owners"]))
    return {
        **scored,
        "their_accuracy": theirs["pli_success"] / len(targets),
        "their_ssim": theirs["pli_ssim_private_mean"],
        "their_too_close_to_public": theirs["pli_too_close_to_public"],
        "client_acc": float(np.mean(accuracy)),
        **asdict(measured),
    }


# ------------------------------------------------------------------------------------------- the table


#: (result key, column title, digits) of the side-by-side table
COLUMNS = (
    ("accuracy", "attack acc", 3),
    ("ssim", "SSIM to private mean", 3),
    ("too_close_to_public", "too close to public", 1),
    ("owner_pick", "Eq. 11 picks owner", 3),
    ("owner_accuracy", "owner's candidate acc", 3),
    ("client_acc", "client test acc", 3),
    ("wall_s", "wall s", 0),
    ("peak_rss_mib", "peak RSS MiB", 0),
)
#: the fdattack metric whose kind sets a column's interval, where the column's key is not one (fdattack/statistics/kinds.py)
KINDS = {"owner_pick": "accuracy", "owner_accuracy": "accuracy", "client_acc": "client_acc_mean"}
#: (result key, title) of the per-seed rows and the paired differences
PAIRED = (("accuracy", "attack acc"), ("ssim", "SSIM"), ("owner_pick", "owner pick"), ("client_acc", "client acc"))


def table(results: dict[int, dict[str, dict]], prior_scores: dict[int, dict], variant: str = "") -> str:
    """The side-by-side table over the seeds, the per-seed rows and the paired differences (``variant``: a note on the
    authors' side)."""
    seeds = sorted(results)
    lines = [
        f"seeds {seeds}; mean [95 % interval over the seeds of each metric's kind; t for differences]"
        + (f"; authors' side: {variant}" if variant else ""),
        "",
    ]
    lines += ["| side | " + " | ".join(title for _, title, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for side in SIDES:
        rows = [results[s][side] for s in seeds if side in results[s]]
        if rows:
            lines.append(
                f"| {side} | " + " | ".join(fmt([r[key] for r in rows], d, key=KINDS.get(key, key)) for key, _, d in COLUMNS) + " |"
            )
    priors = [prior_scores[s] for s in seeds if s in prior_scores]
    if priors:
        lines.append(
            f"| the shared prior | {fmt([p['accuracy'] for p in priors], key='accuracy')} | {fmt([p['ssim'] for p in priors])} |" + " |" * 6
        )
    theirs = [results[s]["authors"] for s in seeds if "authors" in results[s]]
    if theirs:
        accuracy, ssim = fmt([r["their_accuracy"] for r in theirs], key="accuracy"), fmt([r["their_ssim"] for r in theirs])
        lines += ["", f"authors' own evaluation (result.txt) of their reconstructions: accuracy {accuracy}, SSIM {ssim}"]
    lines += [
        "",
        "| seed | " + " | ".join(f"{title} fdattack | {title} authors" for _, title in PAIRED) + " |",
        "|---" * (2 * len(PAIRED) + 1) + "|",
    ]
    for s in seeds:
        cells = [f"{results[s][side][key]:.3f}" if side in results[s] else "-" for key, _ in PAIRED for side in SIDES]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    paired = [s for s in seeds if all(side in results[s] for side in SIDES)]
    if len(paired) >= 2:
        lines += ["", "paired differences fdattack − authors:"]
        for key, title in PAIRED:
            lines.append(f"* {title}: {fmt([results[s]['fdattack'][key] - results[s]['authors'][key] for s in paired])}")
    return "\n".join(lines)


def result_path(out: Path, scenario: Scenario, seed: int, side: str) -> Path:
    """Where ``side``'s result of ``seed`` in this cell goes."""
    return out / f"result_{scenario.tag_of(side)}_seed{seed}_{side}.json"


def variant_of(scenario: Scenario) -> str:
    """The note :func:`table` prints on the authors' side, empty for their code as patched by default."""
    return "p-hat^0 per row (--authors-per-row-p0)" if scenario.authors_per_row_p0 else ""


def load_results(out: Path, scenario: Scenario, seeds: list[int]) -> tuple[dict[int, dict[str, dict]], dict[int, dict]]:
    """Every side's result (:func:`result_path`) and ``prior_<tag>_seed<k>.json`` under ``out`` for ``seeds``."""
    results: dict[int, dict[str, dict]] = {}
    priors: dict[int, dict] = {}
    for s in seeds:
        for side in SIDES:
            path = result_path(out, scenario, s, side)
            if path.is_file():
                results.setdefault(s, {})[side] = json.loads(path.read_text())
        if (out / f"prior_{scenario.tag}_seed{s}.json").is_file():
            priors[s] = json.loads((out / f"prior_{scenario.tag}_seed{s}.json").read_text())
    return results, priors


def prepare_seed(scenario: Scenario, seed: int, out: Path) -> tuple[FederatedSplit, dict[str, np.ndarray], torch.Tensor | None]:
    """Write the seed's split file, and with gamma > 0 its prior file and the prior's own scores."""
    cfg = fdattack_config(scenario, seed)
    split = build_split(cfg.data, int(cfg.protocol.num_clients), int(cfg.seed))
    arrays = write_split(scenario, split, out / f"split_seed{seed}.npz")
    print(f"seed {seed}: split {digest(arrays)[:16]} -> {out / f'split_seed{seed}.npz'}", flush=True)
    if scenario.gamma == 0:
        return split, arrays, None
    started = time.perf_counter()
    prior = learned_prior(cfg, split)
    torch.save(prior, out / f"prior_{scenario.tag}_seed{seed}.pt")
    targets = torch.as_tensor(arrays["targets"])
    metrics, _ = ReconstructionScorer(split).measure(prior[targets], targets)
    scores = {"accuracy": metrics["accuracy"], "ssim": metrics["ssim"], "build_s": time.perf_counter() - started}
    (out / f"prior_{scenario.tag}_seed{seed}.json").write_text(json.dumps(scores, indent=1))
    print(f"seed {seed}: prior accuracy {scores['accuracy']:.3f}, SSIM {scores['ssim']:.3f} ({scores['build_s']:.0f} s)", flush=True)
    return split, arrays, prior


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", type=Path, help=f"checkout of FLAIR-THU/PairedLogitsInversion at {PINNED}")
    parser.add_argument("--authors-python", default=sys.executable, help="python with cv2, pandas and scikit-image for the authors' side")
    parser.add_argument("--out", type=Path, required=True, help="where the splits, the runs and the results go")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--side", choices=("both", *SIDES), default="both")
    parser.add_argument("--table-only", action="store_true", help="print the table of the results already in --out, run nothing")
    parser.add_argument("--data-root", default=Scenario.data_root, help="folder of the AT&T faces (s1..s40)")
    knobs = ("clients", "rounds", "gamma", "tau", "alpha", "lr", "epochs_per_round", "max_width", "prior_epochs")
    for knob in knobs:  # the scenario's other knobs, defaults as in Scenario
        default = getattr(Scenario, knob)
        parser.add_argument(f"--{knob.replace('_', '-')}", type=type(default), default=default, help=f"(default {default})")
    parser.add_argument("--authors-per-row-p0", action="store_true", help="diagnostic: the authors' p-hat^0 per row (Eq. 6), as fdattack's")
    args = parser.parse_args(argv)
    if args.rounds % 2 == 0:  # the authors save the candidates on odd rounds only (tbi_train.py: api.epoch % 2 == 1)
        parser.error("--rounds must be odd: the authors' code saves reconstructions after odd rounds only")
    torch.set_num_threads(1)
    scenario = Scenario(
        data_root=str(Path(args.data_root).resolve()), authors_per_row_p0=args.authors_per_row_p0, **{k: getattr(args, k) for k in knobs}
    )
    out = args.out.resolve()
    if args.table_only:
        print(table(*load_results(out, scenario, args.seeds), variant_of(scenario)))
        return
    if args.authors is None and args.side != "fdattack":
        parser.error("--authors is required (a checkout of the authors' repository)")
    out.mkdir(parents=True, exist_ok=True)
    if args.authors is not None and (commit := checkout_commit(args.authors)) not in (None, PINNED):
        print(f"warning: {args.authors} is at {commit}, the patch was written for {PINNED}", file=sys.stderr)
    sides = SIDES if args.side == "both" else (args.side,)
    for seed in args.seeds:
        split, arrays, prior = prepare_seed(scenario, seed, out)
        prior_file = out / f"prior_{scenario.tag}_seed{seed}.pt" if prior is not None else None
        for side in sides:
            if side == "fdattack":
                result = run_fdattack(scenario, seed, split, arrays, prior, out)
            else:
                files = (out / f"split_seed{seed}.npz", prior_file)
                result = run_authors(scenario, seed, split, arrays, files, out, args.authors.resolve(), args.authors_python)
            result_path(out, scenario, seed, side).write_text(json.dumps(result, indent=1))
            print(f"seed {seed} {side}: accuracy {result['accuracy']:.3f}, SSIM {result['ssim']:.3f}, {result['wall_s']:.0f} s", flush=True)
    text = table(*load_results(out, scenario, args.seeds), variant_of(scenario))
    (out / f"table_{scenario.tag_of('authors')}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
