"""fdattack's GMI and KED-MI (with FedInverse's HSIC term) side by side with the FedInverse authors' code
(Jun-B0518/FedInverse) on the same MNIST split, the same FedAvg clients per round and the same evaluation classifier.

For each seed the driver

1. cuts MNIST with fdattack's own data code (``conf/experiment/fedinverse_mnist.yaml`` at 32 px with the scenario's
   overrides) and writes ``OUT/split_seed<k>.npz``: the attacker's prior images (1,000 digits 5-9), every client's
   private digits 0-4, the test set and the participants of every FedAvg round (fdattack's own
   ``FedAvgProtocol.participants``), images as fdattack holds them (float32, 1×32×32, [-1, 1]);
2. runs ``fdattack run`` in a subprocess (``OUT/fdattack_l<λ>_seed<k>/``: FedAvg with GMI and KED-MI after every
   aggregation), checks that its ``partition.json`` is the split in the file, and reads its per-round metrics;
3. converts the run's evaluation classifier (the SCNN on all ten digits, ``artifacts/inversion_classifier_*.pt``) to
   the authors' ``SCNN`` keys (``eval_scnn.tar``), so that their own top-1 uses the same classifier;
4. copies the authors' checkout to ``OUT/authors_l<λ>_seed<k>/code``, applies ``authors.patch`` (CPU, one thread, the
   split file, flags for the unreleased configs, the final images saved as ``.npy``) and runs their five scripts in
   sequence: ``FL/src/FL_main.py`` (FedAvg, the global model of every round saved), ``GMI/train_gan.py`` (the WGAN-GP
   prior, once), then per round ``GMI/attack_batchhsic_fl.py``, ``DMI/k+1_gan_fl.py`` (the K+1 GAN against the
   round's model) and ``DMI/recovery_batchhsic_fl.py``;
5. scores both sides' inversions of every round with fdattack's ``InversionScorer`` built on the run's classifier
   (top-1/top-5 of the SCNN, FID in SCNN features against the private digits, k-NN distance), and each side's images
   under its own round model (``target_top1``), and prints a table over the seeds with 95 % intervals of each
   metric's kind and the per-seed paired differences with their t intervals.

The sides run one after the other, never at once, each with ``OMP_NUM_THREADS=1`` and one torch thread. Wall time is
the sum over a side's processes and peak RSS their maximum (``os.wait4``).

Usage::

    python benchmarks/peers/fedinverse/run.py --authors PATH_TO_CHECKOUT --authors-python VENV/bin/python --out DIR \\
        [--seeds 0 1 2] [--lambda-h 0.05] [--side both]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from omegaconf import DictConfig

from fdattack.attacks.results import Inversions
from fdattack.config import load_config
from fdattack.data.federated import FederatedSplit, build_split
from fdattack.engine import LocalTrainer
from fdattack.engine.trainer import make_fabric
from fdattack.evaluation.inversion import InversionScorer, inversion_scorer
from fdattack.evaluation.inversion_classifier import InversionEvaluationSettings
from fdattack.fd.protocols.fedavg import FedAvgProtocol
from fdattack.models.classifiers import MCNN
from fdattack.randomness import derive_seed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/peers: the drivers' shared helpers
from common import SIDES, Measured, check_partition, checkout_commit, digest, fmt, patched_copy, run_child  # noqa: E402

#: the authors' commit the patch applies to (later commits only edit the README)
PINNED = "d686a7498a5e98658bc2a693d930389622056737"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
EXPERIMENT = REPO / "conf" / "experiment" / "fedinverse_mnist.yaml"
PATCH = HERE / "authors.patch"
ATTACKS = ("gmi", "kedmi")


@dataclass(frozen=True)
class Scenario:
    """What both sides run: ``fedinverse_mnist`` at 32 px and GAN width 64 (the authors' MNIST networks), K = 20."""

    clients: int = 20
    fraction: float = 0.5
    rounds: int = 3
    local_epochs: int = 1
    local_batch: int = 10
    local_lr: float = 0.01
    #: λ_H of FedInverse's HSIC term in both searches (0: plain GMI and KED-MI); Gaussian nHSIC, σ = ``sigma``
    lambda_h: float = 0.0
    sigma: float = 5.0
    gmi_gan_epochs: int = 30
    kedmi_gan_epochs: int = 15
    gan_lr: float = 1e-3
    gan_batch: int = 64
    n_critic: int = 5
    gmi_iterations: int = 500
    gmi_lr: float = 0.01
    gmi_seeds: int = 10
    kedmi_iterations: int = 300
    kedmi_lr: float = 0.02
    kedmi_samples: int = 50
    #: epochs of the evaluation SCNN (trained once, by fdattack's run, on all ten digits)
    eval_epochs: int = 5
    data_root: str = str(REPO.parent / "shared" / "data" / "mnist_t10k")

    @property
    def tag(self) -> str:
        """The cell's name in file names, e.g. ``l0.05``."""
        return f"l{self.lambda_h:g}"

    def fdattack_overrides(self, seed: int) -> list[str]:
        """``key=value`` overrides of :data:`EXPERIMENT` for this scenario (W&B off)."""
        gan = [
            "gan_width=64",
            f"gan_lr={self.gan_lr}",
            f"gan_batch_size={self.gan_batch}",
            f"n_critic={self.n_critic}",
            f"hsic_lambda={self.lambda_h}",
            f"hsic_sigma={self.sigma}",
        ]
        return [
            "attacks=[gmi,kedmi]",
            "logger.wandb.mode=disabled",
            "logger.progress=never",
            f"seed={seed}",
            f"data.root={self.data_root}",
            "data.image_size=32",
            f"protocol.num_clients={self.clients}",
            f"protocol.fraction={self.fraction}",
            f"protocol.rounds={self.rounds}",
            f"protocol.local_epochs={self.local_epochs}",
            f"protocol.optim.batch_size={self.local_batch}",
            f"protocol.optim.lr={self.local_lr}",
            *(f"attack.{a}.{kv}" for a in ATTACKS for kv in gan),
            f"attack.gmi.gan_epochs={self.gmi_gan_epochs}",
            f"attack.gmi.iterations={self.gmi_iterations}",
            f"attack.gmi.lr={self.gmi_lr}",
            f"attack.gmi.seeds={self.gmi_seeds}",
            f"attack.kedmi.gan_epochs={self.kedmi_gan_epochs}",
            f"attack.kedmi.iterations={self.kedmi_iterations}",
            f"attack.kedmi.lr={self.kedmi_lr}",
            f"attack.kedmi.samples={self.kedmi_samples}",
            f"evaluation.inversion.epochs={self.eval_epochs}",
        ]

    def authors_steps(self, seed: int, split: Path, work: Path, eval_path: Path) -> list[tuple[str, str, list[str]]]:
        """The authors' processes in order: (name, cwd relative to their checkout, script and arguments)."""
        common = ["--gpu", "0", "--threads", "1"]
        hsic = ["--attack_improve", "BATCHHSIC", "--lamda", str(self.lambda_h), "--sigma", str(self.sigma)]
        gan = ["--lr", str(self.gan_lr), "--batch_size", str(self.gan_batch), "--n_critic", str(self.n_critic), "--seed", str(seed)]
        steps = [
            (
                "fl",
                "FL/src",
                [
                    *("FL_main.py", "--model", "cnn", "--net", "MCNN", "--dataset", "mnist", "--iid", "1"),
                    *("--num_users", str(self.clients), "--frac", str(self.fraction), "--epochs", str(self.rounds)),
                    *("--local_ep", str(self.local_epochs), "--local_bs", str(self.local_batch), "--lr", str(self.local_lr)),
                    *("--optimizer", "sgd", "--measure", "None", "--seed", str(seed), "--save_clients", "0"),
                    *("--split_file", str(split), "--out_dir", str(work / "fl"), *common),
                ],
            ),
            (
                "gmi_gan",
                "GMI",
                [
                    *("train_gan.py", "--dataset", "mnist", "--split_file", str(split), "--out_dir", str(work / "gmi_gan")),
                    *("--epochs", str(self.gmi_gan_epochs), *gan, *common),
                ],
            ),
        ]
        for r in range(1, self.rounds + 1):
            target = str(work / "fl" / f"round_{r}.tar")
            steps += [
                (
                    f"gmi_r{r}",
                    "GMI",
                    [
                        *("attack_batchhsic_fl.py", "--dataset", "mnist", "--defense", "reg", *hsic, "--kernelfunc", "gaussian"),
                        *("--iter", str(self.gmi_iterations), "--seeds", str(self.gmi_seeds), "--target_path", target),
                        *("--gan_dir", str(work / "gmi_gan"), "--eval_path", str(eval_path), "--eval_signed", "1"),
                        *("--npy_out", str(work / f"gmi_round_{r}.npy"), "--skip_fid", "1"),
                        *("--save_img_dir", str(work / f"gmi_png_{r}"), *common),
                    ],
                ),
                (
                    f"kedmi_gan_r{r}",
                    "DMI",
                    [
                        *("k+1_gan_fl.py", "--dataset", "mnist", "--defense", "reg", "--split_file", str(split)),
                        *("--target_path", target, "--out_dir", str(work / f"kedmi_gan_{r}"), "--epochs", str(self.kedmi_gan_epochs)),
                        *gan,
                        *common,
                    ],
                ),
                (
                    f"kedmi_r{r}",
                    "DMI",
                    [
                        *("recovery_batchhsic_fl.py", "--dataset", "mnist", "--defense", "reg", *hsic),
                        *("--iter", str(self.kedmi_iterations), "--seeds", str(self.kedmi_samples), "--repeats", "1"),
                        *("--gan_dir", str(work / f"kedmi_gan_{r}"), "--target_path", target, "--eval_path", str(eval_path)),
                        *("--eval_signed", "1", "--npy_out", str(work / f"kedmi_round_{r}.npy"), "--skip_fid", "1"),
                        *("--save_img_dir", str(work / f"kedmi_png_{r}"), "--seed", str(seed), *common),
                    ],
                ),
            ]
        return steps


# ------------------------------------------------------------------------------------------- the split
def fdattack_config(scenario: Scenario, seed: int) -> DictConfig:
    """The resolved fdattack configuration of this scenario and seed."""
    return load_config(EXPERIMENT, scenario.fdattack_overrides(seed))


def participants(cfg: DictConfig) -> np.ndarray:
    """(R, m) the clients of rounds 1..R, drawn by fdattack's own ``FedAvgProtocol.participants``."""
    protocol = SimpleNamespace(cfg=cfg.protocol, num_clients=int(cfg.protocol.num_clients), seed=int(cfg.seed))
    return np.array([FedAvgProtocol.participants(protocol, r) for r in range(1, int(cfg.protocol.rounds) + 1)])  # type: ignore[arg-type]


def split_arrays(split: FederatedSplit, cfg: DictConfig) -> dict[str, np.ndarray]:
    """The split as the arrays both sides read (images as fdattack holds them: float32, (1, 32, 32), [-1, 1])."""
    return {
        "public_images": split.public.images.numpy(),
        "public_labels": split.public.labels.numpy(),
        "public_source": split.public.source.numpy(),
        "private_images": torch.cat([p.images for p in split.private]).numpy(),
        "private_labels": torch.cat([p.labels for p in split.private]).numpy(),
        "private_source": torch.cat([p.source for p in split.private]).numpy(),
        "private_sizes": np.array([len(p) for p in split.private]),
        "test_images": split.test.images.numpy(),
        "test_labels": split.test.labels.numpy(),
        "test_source": split.test.source.numpy(),
        "targets": np.arange(split.num_classes),
        "num_classes": np.array(split.num_classes),
        "participants": participants(cfg),
    }


# ------------------------------------------------------------------------------------------- scoring
def scorer_of(split: FederatedSplit, classifier_file: Path, seed: int) -> InversionScorer:
    """fdattack's inversion scorer with the run's evaluation classifier loaded from ``classifier_file`` and the run's
    held-out images (drawn with the run's classifier seed, as ``build_inversion_scorer`` does)."""
    engine = LocalTrainer(make_fabric("cpu", 1, "auto", 1, "32-true"), batch_size=64, vectorise=False)
    settings = InversionEvaluationSettings(classifier="scnn", checkpoint=str(classifier_file))
    return inversion_scorer(split, engine, settings, derive_seed(seed, "inversion_classifier"), None)


def scores(scorer: InversionScorer, attack: str, images: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """fdattack's metrics of (S, T, 1, 32, 32) inversions in [-1, 1]."""
    metrics = scorer.measure(attack, Inversions(images, targets)).metrics
    keys = ("top1", "top5", "fid", "knn_dist", "eval_classifier_accuracy")
    return {k: metrics[f"attack/{attack}/{k}"] for k in keys}


def authors_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fdattack's SCNN ``state_dict`` under the authors' ``DataParallel(SCNN)`` names (the same layer indices)."""
    renamed = {}
    for key, value in state.items():
        head, rest = key.split(".", 1)
        renamed["module." + {"features": "feature", "fc": "fc_layer"}[head] + "." + rest] = value
    return renamed


def fdattack_mcnn(path: Path, num_classes: int) -> MCNN:
    """The authors' round model (their ``MCNN``: ``layer1-3``, ``fc_layer``) loaded into fdattack's ``MCNN``."""
    offsets = {"layer1": 0, "layer2": 4, "layer3": 8}
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    renamed = {}
    for key, value in state.items():
        head, index, rest = key.split(".", 2) if key.startswith("layer") else ("fc_layer", "", key.split(".", 1)[1])
        renamed[f"features.{offsets[head] + int(index)}.{rest}" if head in offsets else f"fc.{rest}"] = value
    net = MCNN(1, 32, num_classes)
    net.load_state_dict(renamed)
    return net.eval()


@torch.no_grad()
def target_top1(net: torch.nn.Module, unit_images: torch.Tensor, targets: torch.Tensor) -> float:
    """The share of (S, T, 1, 32, 32) images in [0, 1] that the round model ``net`` puts in their column's label."""
    s, t = unit_images.shape[:2]
    predicted = net(unit_images.reshape(s * t, *unit_images.shape[2:])).argmax(1).view(s, t)
    return float((predicted == targets).float().mean())


# ------------------------------------------------------------------------------------------- the sides
def merged_rounds(run_dir: Path) -> dict[int, dict[str, float]]:
    """``rounds.jsonl`` as {round: every metric logged for it} (a round's rows merged, the latest value kept)."""
    rounds: dict[int, dict[str, float]] = {}
    for line in (run_dir / "rounds.jsonl").read_text().splitlines():
        row = json.loads(line)
        rounds.setdefault(int(row["round"]), {}).update({k: v for k, v in row.items() if v is not None})
    return rounds


def run_fdattack(scenario: Scenario, seed: int, split: FederatedSplit, arrays: dict[str, np.ndarray], out: Path, reuse: bool) -> dict:
    """``fdattack run`` in a subprocess (with ``reuse``: the finished run already in ``out``, if any); its per-round
    metrics, its round artifacts checked against them."""
    run_dir = out / f"fdattack_{scenario.tag}_seed{seed}"
    measured_file = out / f"{run_dir.name}.measured.json"
    if reuse and (run_dir / "metrics.json").is_file() and measured_file.is_file():
        measured = Measured(**json.loads(measured_file.read_text()))
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        overrides = [*scenario.fdattack_overrides(seed), f"output_dir={run_dir}"]
        measured = run_child([sys.executable, "-m", "fdattack", "run", str(EXPERIMENT), *overrides], REPO, out / f"{run_dir.name}.log")
        measured_file.write_text(json.dumps(asdict(measured)))
    check_partition(run_dir / "partition.json", *(arrays[k] for k in ("public_source", "test_source", "private_source", "private_sizes")))
    (classifier_file,) = (run_dir / "artifacts").glob("inversion_classifier_*.pt")
    scorer = scorer_of(split, classifier_file, seed)
    logged = merged_rounds(run_dir)
    targets = torch.as_tensor(arrays["targets"])
    rounds = {}
    for r in range(1, scenario.rounds + 1):
        rounds[r] = {"server_acc": logged[r]["protocol/server_acc"]}
        for attack in ATTACKS:
            stored = torch.load(run_dir / "artifacts" / f"{attack}_inversions_round_{r:04d}.pt", weights_only=True)
            images = stored["images"].float() / 255 * 2 - 1
            rescored = scores(scorer, attack, images, targets)
            s, t = images.shape[:2]
            # within one image: the artifact is uint8, the run scored float images (and logs float32)
            assert abs(rescored["top1"] - logged[r][f"attack/{attack}/top1"]) <= 1 / (s * t) + 1e-6, (
                "the artifact is not what the run scored"
            )
            logged_accuracy = logged[r][f"attack/{attack}/eval_classifier_accuracy"]
            assert abs(rescored["eval_classifier_accuracy"] - logged_accuracy) < 1e-6, "not the run's classifier"
            rounds[r][attack] = {
                **{k: logged[r][f"attack/{attack}/{k}"] for k in ("top1", "top5", "fid", "knn_dist", "target_top1")},
                "eval_classifier_accuracy": rescored["eval_classifier_accuracy"],
            }
    return {"rounds": rounds, "classifier_file": str(classifier_file), **asdict(measured)}


def write_eval_classifier(classifier_file: Path, dest: Path) -> Path:
    """The run's SCNN as the authors' attack scripts load their evaluation classifier ``E``."""
    state = torch.load(classifier_file, map_location="cpu", weights_only=True)["net"]
    torch.save({"state_dict": authors_keys(state)}, dest)
    return dest


def skipped(checkout: Path, folder: Path, names: list[str]) -> list[str]:
    """What the patched copy leaves out: ``.git``, VMI's third-party code, notebooks and pictures."""
    top = folder.resolve() == checkout.resolve()
    return [
        n
        for n in names
        if n == ".git" or n.endswith((".ipynb", ".png")) or (folder.name == "VMI" and n == "3rd_party") or (top and n == "attack_res")
    ]


def run_authors(
    scenario: Scenario, seed: int, arrays: dict[str, np.ndarray], classifier_file: Path, out: Path, checkout: Path, python: str
) -> dict:
    """The patched authors' five scripts in sequence; their every round's inversions scored by fdattack."""
    work = out / f"authors_{scenario.tag}_seed{seed}"
    if work.exists():
        shutil.rmtree(work)
    code = patched_copy(checkout, work / "code", PATCH, lambda folder, names: skipped(checkout, Path(folder), names))
    eval_path = write_eval_classifier(classifier_file, work / "eval_scnn.tar")
    (work / "logs").mkdir()
    measured = []
    for name, cwd, args in scenario.authors_steps(seed, out / f"split_seed{seed}.npz", work, eval_path):
        measured.append(run_child([python, *args], code / cwd, work / "logs" / f"{name}.log", {"MPLBACKEND": "Agg"}))
        print(f"  authors {name}: {measured[-1].wall_s:.0f} s", flush=True)
    rounds = {}
    for r in range(1, scenario.rounds + 1):
        rounds[r] = {"server_acc": json.loads((work / "fl" / f"round_{r}.json").read_text())["test_acc"]}
        for attack in ATTACKS:
            theirs = json.loads((work / f"{attack}_round_{r}.json").read_text())
            rounds[r][attack] = {"npy": str(work / f"{attack}_round_{r}.npy"), "their_top1": theirs["acc"], "their_top5": theirs["acc5"]}
    wall = sum(m.wall_s for m in measured)
    return {"rounds": rounds, **asdict(Measured(wall, max(m.peak_rss_mib for m in measured))), "steps": [asdict(m) for m in measured]}


def score_authors(result: dict, scorer: InversionScorer, targets: torch.Tensor, work: Path) -> dict:
    """fdattack's metrics of the authors' stored inversions, their round models' own top-1 of them, and a check that
    their top-1 (the same SCNN) agrees with fdattack's scorer."""
    for r, row in result["rounds"].items():
        net = fdattack_mcnn(work / "fl" / f"round_{r}.tar", len(targets))
        for attack in ATTACKS:
            unit = torch.from_numpy(np.load(row[attack]["npy"]))
            row[attack].update(scores(scorer, attack, unit * 2 - 1, targets))
            row[attack]["target_top1"] = target_top1(net, unit, targets)
            s, t = unit.shape[:2]  # within one image: they score batches of five, fdattack larger ones (float rounding)
            assert abs(row[attack]["their_top1"] - row[attack]["top1"]) <= 1 / (s * t) + 1e-6, (
                f"their {attack} top-1 and fdattack's scorer disagree"
            )
    return result


# ------------------------------------------------------------------------------------------- the table
#: (key, title, digits) of the per-attack columns
COLUMNS = (
    ("top1", "SCNN top-1", 3),
    ("top5", "SCNN top-5", 3),
    ("fid", "FID (SCNN features)", 1),
    ("knn_dist", "k-NN dist", 1),
    ("target_top1", "target top-1", 3),
)


def cell(result: dict, attack: str, key: str, where: str) -> float:
    """A side's value of ``key`` for ``attack`` at the last round (``where="last"``) or its mean over the rounds."""
    rounds = result["rounds"]
    values = [rounds[r][attack][key] for r in sorted(rounds, key=int)]
    return values[-1] if where == "last" else float(np.mean(values))


def table(results: dict[int, dict[str, dict]], scenario: Scenario) -> str:
    """Per attack: both sides' metrics at the last round and over the rounds, with the paired differences."""
    seeds = sorted(results)
    paired = [s for s in seeds if all(side in results[s] for side in SIDES)]
    lines = [
        f"λ_H = {scenario.lambda_h:g}; seeds {seeds}; mean [95 % interval over the seeds of each metric's kind; t for differences]",
        "",
    ]
    for attack in ATTACKS:
        for where, title in (("last", f"round {scenario.rounds}"), ("mean", "mean over the rounds")):
            lines += [f"**{attack.upper()}, {title}**", ""]
            lines += ["| side | " + " | ".join(t for _, t, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
            for side in SIDES:
                rows = [results[s][side] for s in seeds if side in results[s]]
                if rows:
                    lines.append(
                        f"| {side} | " + " | ".join(fmt([cell(r, attack, k, where) for r in rows], d, key=k) for k, _, d in COLUMNS) + " |"
                    )
            if len(paired) >= 2:
                diffs = [
                    fmt([cell(results[s]["fdattack"], attack, k, where) - cell(results[s]["authors"], attack, k, where) for s in paired], d)
                    for k, _, d in COLUMNS
                ]
                lines.append("| fdattack − authors | " + " | ".join(diffs) + " |")
            lines.append("")
    lines += ["| side | server acc (last round) | wall s | peak RSS MiB |", "|---|---|---|---|"]
    for side in SIDES:
        rows = [results[s][side] for s in seeds if side in results[s]]
        if rows:
            last = [r["rounds"][max(r["rounds"], key=int)]["server_acc"] for r in rows]
            wall, rss = ([r[k] for r in rows if np.isfinite(r[k])] for k in ("wall_s", "peak_rss_mib"))  # NaN: not recorded
            lines.append(f"| {side} | {fmt(last, key='server_acc')} | {fmt(wall, 0, key='wall_s')} | {fmt(rss, 0, key='peak_rss_mib')} |")
    lines += ["", "per seed (round-by-round SCNN top-1, GMI / KED-MI):", ""]
    for s in seeds:
        for side in SIDES:
            if side in results[s]:
                rounds = results[s][side]["rounds"]
                series = " ".join(f"{rounds[r]['gmi']['top1']:.2f}/{rounds[r]['kedmi']['top1']:.2f}" for r in sorted(rounds, key=int))
                lines.append(f"* seed {s} {side}: {series}; server acc {rounds[max(rounds, key=int)]['server_acc']:.3f}")
    return "\n".join(lines)


def figure(out: Path, scenario: Scenario, seed: int, path: Path, samples: int = 4) -> None:
    """Both sides' last-round inversions of ``seed`` side by side: a row per side and attack, ``samples`` images of each
    target digit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = scenario.rounds
    rows = []
    for attack in ATTACKS:
        ours = torch.load(
            out / f"fdattack_{scenario.tag}_seed{seed}" / "artifacts" / f"{attack}_inversions_round_{r:04d}.pt", weights_only=True
        )
        rows.append((f"fdattack {attack.upper()}", ours["images"].float() / 255))
        rows.append(
            (f"authors {attack.upper()}", torch.from_numpy(np.load(out / f"authors_{scenario.tag}_seed{seed}" / f"{attack}_round_{r}.npy")))
        )
    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 1.25 * len(rows)))
    for ax, (title, images) in zip(axes, rows):
        picked = images[:samples].transpose(0, 1).reshape(-1, *images.shape[2:])  # digit by digit, `samples` each
        grid = torch.cat(list(picked[:, 0]), dim=1)
        ax.imshow(grid.numpy(), cmap="gray", vmin=0, vmax=1)
        ax.set_title(title, fontsize=9, loc="left")
        ax.axis("off")
    fig.suptitle(f"round {r}, λ_H = {scenario.lambda_h:g}, seed {seed}: {samples} samples of each digit 0-4", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def result_path(out: Path, scenario: Scenario, seed: int, side: str) -> Path:
    """Where ``side``'s result of ``seed`` in this cell goes."""
    return out / f"result_{scenario.tag}_seed{seed}_{side}.json"


def load_results(out: Path, scenario: Scenario, seeds: list[int]) -> dict[int, dict[str, dict]]:
    """Every side's result (:func:`result_path`) under ``out`` for ``seeds``."""
    results: dict[int, dict[str, dict]] = {}
    for s in seeds:
        for side in SIDES:
            if (path := result_path(out, scenario, s, side)).is_file():
                results.setdefault(s, {})[side] = json.loads(path.read_text())
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", type=Path, help=f"checkout of Jun-B0518/FedInverse at {PINNED}")
    parser.add_argument("--authors-python", default=sys.executable, help="python with cv2 and pandas for the authors' side")
    parser.add_argument("--out", type=Path, required=True, help="where the splits, the runs and the results go")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--side", choices=("both", *SIDES), default="both")
    parser.add_argument(
        "--reuse-fdattack",
        action="store_true",
        help="score a finished fdattack run already in --out (with its .measured.json) instead of running it again",
    )
    parser.add_argument("--table-only", action="store_true", help="print the table of the results already in --out, run nothing")
    parser.add_argument(
        "--figure", type=Path, help="with --table-only: also draw the first seed's last-round inversions of both sides here"
    )
    knobs = [k for k in Scenario.__dataclass_fields__ if k != "data_root"]
    for knob in knobs:  # the scenario's knobs, defaults as in Scenario
        default = getattr(Scenario, knob)
        parser.add_argument(f"--{knob.replace('_', '-')}", type=type(default), default=default, help=f"(default {default})")
    parser.add_argument("--data-root", default=Scenario.data_root, help="folder of the MNIST test set")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    scenario = Scenario(data_root=str(Path(args.data_root).resolve()), **{k: getattr(args, k) for k in knobs})
    out = args.out.resolve()
    if args.table_only:
        print(table(load_results(out, scenario, args.seeds), scenario))
        if args.figure is not None:
            figure(out, scenario, args.seeds[0], args.figure)
        return
    if args.authors is None and args.side != "fdattack":
        parser.error("--authors is required (a checkout of the authors' repository)")
    out.mkdir(parents=True, exist_ok=True)
    if args.authors is not None and (commit := checkout_commit(args.authors)) not in (None, PINNED):
        print(f"warning: {args.authors} is at {commit}, the patch was written for {PINNED}", file=sys.stderr)
    for seed in args.seeds:
        cfg = fdattack_config(scenario, seed)
        split = build_split(cfg.data, int(cfg.protocol.num_clients), int(cfg.seed))
        arrays = split_arrays(split, cfg)
        np.savez(out / f"split_seed{seed}.npz", **arrays, digest=np.array(digest(arrays)), scenario=np.array(json.dumps(asdict(scenario))))
        print(f"seed {seed}: split {digest(arrays)[:16]} -> {out / f'split_seed{seed}.npz'}", flush=True)
        fdattack_path = result_path(out, scenario, seed, "fdattack")
        if args.side in ("both", "fdattack"):
            fdattack_path.write_text(json.dumps(run_fdattack(scenario, seed, split, arrays, out, args.reuse_fdattack), indent=1))
            print(f"seed {seed} fdattack: done", flush=True)
        if args.side in ("both", "authors"):
            if not fdattack_path.is_file():
                parser.error(f"{fdattack_path} is missing: the authors' side is scored with the classifier of fdattack's run")
            classifier_file = Path(json.loads(fdattack_path.read_text())["classifier_file"])
            result = run_authors(scenario, seed, arrays, classifier_file, out, args.authors.resolve(), args.authors_python)
            scored = score_authors(
                result,
                scorer_of(split, classifier_file, seed),
                torch.as_tensor(arrays["targets"]),
                out / f"authors_{scenario.tag}_seed{seed}",
            )
            result_path(out, scenario, seed, "authors").write_text(json.dumps(scored, indent=1))
            print(f"seed {seed} authors: done", flush=True)
    text = table(load_results(out, scenario, args.seeds), scenario)
    (out / f"table_{scenario.tag}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
