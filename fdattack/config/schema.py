"""The run-wide config schemas: data, model, optimizer, protocol base, trainer, logger, evaluation, experiment.

Components with their own knobs own their dataclass next to their code (each protocol's config in
``fd/protocols/``, each attack's settings in ``attacks/``, each defense's in ``defenses/``); the
registries put them under ``protocol``, ``attack.<name>`` and ``defense.<name>`` (:mod:`fdattack.config.compose`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from fdattack.evaluation.confidence_gap import ConfidenceGapSettings
from fdattack.evaluation.inversion_classifier import InversionEvaluationSettings
from fdattack.knobs import Choice, knob
from fdattack.statistics.intervals import BOOTSTRAP_RESAMPLES_MAX

SEED_MAX = 2**32 - 1  # numpy (and Lightning's seed_everything) take seeds in [0, 2**32 - 1]
MAX_IMAGE_SIZE = 1024  # side in pixels; a larger one is a typo that would allocate terabytes, not a run


class Split(Choice):
    pli = "pli"
    random = "random"
    classes = "classes"


class Partition(Choice):
    disjoint_identities = "disjoint_identities"
    dirichlet = "dirichlet"
    shards = "shards"
    iid = "iid"
    two_classes = "two_classes"


class LabelSpace(Choice):
    all = "all"
    targets = "targets"


@dataclass
class PublicDatasetConfig:
    """A public set taken from another dataset (Shi et al., PoPETs 2025, §4.1.1: CIFAR-10 private / CIFAR-100 public; Table 8)."""

    name: Optional[str] = knob(
        None,
        "dataset registry name of the public set, different from data.name; its samples are unlabeled for the run; noise = size dummy "
        "images of uniform noise (the L-Attack's CelebA server, Xiao et al., DSN 2024, §VI-A). null = the public set is cut from "
        "data.name's pool",
    )
    root: Optional[str] = knob(None, "its folder (as data.root)")
    download: bool = knob(False, "let torchvision download it into its root (needs internet)")
    size: Optional[int] = knob(None, "how many random samples of its training split form the public set; null = all of them", ge=1)
    image_size: Optional[int] = knob(None, "resize its images to image_size x image_size; null = data.image_size", ge=4, le=MAX_IMAGE_SIZE)


@dataclass
class DataConfig:
    name: str = knob(
        "digits",
        "dataset registry name: digits | mnist | att_faces | image_folder | cifar10 | cifar100 | cinic10 | fashion_mnist | celeba | "
        "purchase | synthetic",
    )
    root: Optional[str] = knob(
        None,
        "folder of file-based datasets (mnist IDX files, att_faces sN/, image_folder, cinic10 train/ and test/, purchase's "
        "dataset_purchase); relative paths are taken from the working directory",
    )
    download: bool = knob(False, "let torchvision download cifar10/cifar100/fashion_mnist/celeba/mnist into root (needs internet)")
    image_size: Optional[int] = knob(None, "resize images to image_size x image_size; null keeps the native size", ge=4, le=MAX_IMAGE_SIZE)
    second_look_subdir: Optional[str] = knob(None, "name=image_folder: subfolder of each identity holding its insensitive look (LAG: y)")
    second_look_root: Optional[str] = knob(
        None, "name=image_folder: parallel tree with the insensitive look under the same file names (masked LFW)"
    )
    max_per_class: Optional[int] = knob(
        None,
        "keep at most this many random images of every label in the pool (the official test split is kept whole); null keeps all",
        ge=2,
    )
    max_classes: Optional[int] = knob(
        None, "keep only the max_classes labels with the most images (image_folder, celeba, att_faces); null keeps all", ge=2
    )
    split: Split = knob(
        Split.pli,
        "how public/private/test are formed: pli (target labels private, others public, auxiliary look public) | random (public_fraction "
        "of the pool public) | classes (public_classes public, the rest private)",
    )
    partition: Partition = knob(Partition.disjoint_identities, "how private data is spread over clients")
    num_targets: Optional[int] = knob(None, "split=pli: number of target (private) labels; null = half of the labels", ge=1)
    public_fraction: float = knob(0.2, "split=random: fraction of the training pool that becomes the public set", gt=0, lt=1)
    public_classes: list[int] = knob([], "split=classes: labels that form the public set")
    private_classes: Optional[int] = knob(
        None,
        "split=classes with public_classes empty: the N labels with the most images are private and renumbered 0..N-1, every other label "
        "public and numbered from N; an official test split joins the pool (CelebA's 1000 identities, Wu et al., ICLR 2024, §4.1)",
        ge=1,
    )
    max_public: Optional[int] = knob(
        None, "split=classes: keep at most this many random public images (FedInverse's 30,000 CelebA prior images); null keeps all", ge=1
    )
    public_dataset: PublicDatasetConfig = knob(
        PublicDatasetConfig(),
        "split=random: a public set from another dataset, replacing the public_fraction cut from the pool (which is then dropped)",
    )
    test_fraction: float = knob(
        0.2, "fraction of each private label's images held out as the test set (used when the dataset has no test split)", ge=0, lt=1
    )
    dirichlet_alpha: float = knob(1.0, "partition=dirichlet: concentration alpha (smaller = more skewed)", gt=0)
    min_client_size: int = knob(1, "partition=dirichlet: redraw until every client has at least this many samples", ge=0)
    shards_per_client: int = knob(2, "partition=shards: label-sorted shards given to each client", ge=1)
    aux_domain: str = knob(
        "blur", "split=pli: how the insensitive public look is made: blur | second_look | none, or a registered domain transform"
    )
    blur_strength: int = knob(2, "aux_domain=blur: side of the normalized box kernel in pixels", ge=1)
    synthetic_num_classes: int = knob(10, "name=synthetic: number of classes", ge=2)
    synthetic_per_class: int = knob(20, "name=synthetic: images per class", ge=2)
    synthetic_image_size: int = knob(8, "name=synthetic: side length of the generated images", ge=4, le=MAX_IMAGE_SIZE)
    synthetic_channels: int = knob(1, "name=synthetic: channels of the generated images", among=(1, 3))
    label_space: LabelSpace = knob(
        LabelSpace.all,
        "all (every label is an output class) | targets (only the target labels: split=pli remaps them to 0..n-1 and other public labels "
        "become -1, as PLI's DS-FL; split=classes gives the models the private classes only, which must be the lowest labels, as "
        "FedInverse's 5-way MNIST model)",
    )
    seed: Optional[int] = knob(None, "seed of the split and partition; null = the run seed", ge=0, le=SEED_MAX)


@dataclass
class ModelConfig:
    name: str = knob(
        "pli_cnn",
        "classifier registry name for every client: pli_cnn | fedinverse_cnn | scnn | pdafd_cnn | lattack_cnn | lattack_mlp | mlp | "
        "resnet18_gn | vgg16_bn | mobilenet_v2",
    )
    clients: list[str] = knob([], "per-client architectures, cycled over the clients (heterogeneous FD); empty = name for all")
    server: Optional[str] = knob(None, "architecture of the server model where the protocol has one; null = name")


@dataclass
class TrainerConfig:
    accelerator: str = knob(
        "cpu", "cpu | gpu | cuda | mps | auto (Lightning Fabric accelerator); every phase, attacks included, trains there"
    )
    devices: Any = knob(1, 'number of devices (or a list of ids, or "auto")')
    strategy: str = knob("auto", "auto | ddp | ddp_spawn | fsdp ... (Lightning strategy)")
    num_nodes: int = knob(1, "nodes for multi-node DDP (torchrun or SLURM launch the ranks)", ge=1)
    precision: str = knob("32-true", "Lightning precision, e.g. 32-true | bf16-mixed | 16-mixed")
    vectorise: Union[bool, str] = knob(
        "auto",
        "train and predict same-architecture clients as one torch.func.vmap batch, equal to one at a time up to float "
        "rounding: auto where it applies (else one at a time, logged) | true, and an error where it cannot "
        "(DDP, precision, training defenses) | false, one at a time",
        among=("auto", True, False),
    )


class WandbMode(Choice):
    auto = "auto"
    online = "online"
    offline = "offline"
    disabled = "disabled"


class WandbArtifacts(Choice):
    all = "all"
    results = "results"
    none = "none"


@dataclass
class WandbConfig:
    mode: WandbMode = knob(WandbMode.auto, "auto (online with credentials, else offline) | online | offline | disabled")
    project: str = knob("fdattack", "W&B project")
    entity: Optional[str] = knob(None, "W&B entity (team or user)")
    group: Optional[str] = knob(None, "W&B run group; null = the experiment name (the sweep name in fdattack sweep)")
    tags: list[str] = knob([], "extra W&B run tags, after the protocol, data, attack and defense names")
    name: Optional[str] = knob(None, "W&B run name; null = the experiment name (the parameter values in fdattack sweep)")
    job_type: Optional[str] = knob(None, "W&B job type; null = run (sweep-trial in fdattack sweep)")
    init_timeout_s: float = knob(
        15.0, "seconds an online W&B start may take; then auto logs offline and online stops with an error", gt=0, finite=True
    )
    artifacts: WandbArtifacts = knob(
        WandbArtifacts.all,
        "the run directory as W&B artifacts at the end: all (results-<id>: config, partition, rounds, metrics, machine, "
        "images, the rounds' reconstructions; checkpoint-<id>: the last checkpoint) | results | none",
    )


class ProgressMode(Choice):
    auto = "auto"
    always = "always"
    never = "never"


class LogLevel(Choice):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


@dataclass
class LoggerConfig:
    wandb: WandbConfig = knob(WandbConfig(), "Weights & Biases")
    progress: ProgressMode = knob(
        ProgressMode.auto, "progress bars over rounds, phases and attack training: auto (only on a TTY) | always | never"
    )
    level: LogLevel = knob(LogLevel.INFO, "stdlib logging level")


@dataclass
class EvaluationConfig:
    classifier: Optional[str] = knob(
        "pdafd_cnn",
        "evaluation classifier of reconstructions (their eval_top1/eval_top5), trained apart from the federated models on the targets' "
        "private images, their public (insensitive) looks and the non-target public labels, so that a copy of the public look is a miss "
        "(eval_top1_public_look: the targets' public means scored by it); a classifier registry name, or null for none",
    )
    epochs: int = knob(30, "its training epochs", ge=1)
    lr: float = knob(1e-3, "its Adam learning rate", gt=0)
    max_candidates: Optional[int] = knob(
        None,
        "membership attacks: how many candidate samples the attacker tests, drawn at random from every client's private samples and the "
        "test samples; null = all of them",
        ge=2,
    )
    bootstrap_resamples: int = knob(
        1000,
        "membership attacks: bootstrap resamples of their metrics' 95 % intervals (each resample re-ranks every client's scores; the "
        "other intervals are closed forms or cheap)",
        ge=100,
        le=BOOTSTRAP_RESAMPLES_MAX,
    )
    confidence_gap: ConfidenceGapSettings = knob(ConfidenceGapSettings(), "the confidence-gap diagnostic")
    inversion: InversionEvaluationSettings = knob(
        InversionEvaluationSettings(), "model-inversion attacks (results of type Inversions): their evaluation classifier and grid"
    )


class IsolationMode(Choice):
    in_process = "in_process"
    process = "process"


@dataclass
class IsolationConfig:
    mode: IsolationMode = knob(
        IsolationMode.in_process,
        "where the attacks run: in_process (in the run's process, beside the protocol) | process (each attack in a worker process of "
        "its own, fed plain copies of its records: what hostile attack code can reach is only itself; docs/threat-model.md)",
    )
    seconds: Optional[float] = knob(
        None,
        "isolation=process: wall seconds each attack may spend in its calls over the whole run; past them its worker is stopped, the run "
        "goes on and the attack's metrics say why (<attack>/stopped); null = no limit",
        gt=0,
    )
    memory_mb: Optional[int] = knob(
        None,
        "isolation=process: memory (MiB) each attack's worker may hold alone (its unique pages, net of those it shares with the "
        "workers' zygote), and the most one of its messages may hold; past it the worker is stopped as with seconds; null = no limit",
        ge=64,
    )
    overlap: bool = knob(
        False,
        "isolation=process: each worker ends a round while the next round simulates, up to the next record it may query on (the "
        "query must be answered in its phase); an attack with an adversary, or whose results are scored on the round's models "
        "(the L-Attack's gradient check), ends its rounds in step. Same results; the round's line is written once its attacks are scored",
    )


@dataclass
class ExperimentConfig:
    """The whole run. ``protocol``, ``attack`` and ``defense`` are filled from the registries (see compose)."""

    name: Optional[str] = knob(
        None,
        "experiment name (run directory prefix, W&B run name), a plain name without path separators; null = <protocol>_<data>_<attacks>, "
        "e.g. dsfl_att_faces_pli-tbi-ldia",
    )
    seed: int = knob(42, "seed of everything (model init, shuffling, splits unless data.seed is set)", ge=0, le=SEED_MAX)
    attack_seed: Optional[int] = knob(
        None,
        "root of the attacks' randomness (their seeds, their workers' generators, the streams of each call), apart from seed; null = seed "
        "in process, and with isolation.mode=process 63 random bits drawn when the run starts and kept in its checkpoints, so that no "
        "isolated attack can search the run seed back from its own; give a number to repeat an isolated run's attacks exactly",
        ge=0,
        le=2**63 - 1,
    )
    seeds: Optional[list[int]] = knob(
        None,
        "run one replica per seed (e.g. seeds=[0,1,2]) in output_dir/seed_<s>/ and write their aggregate (mean, std and 95 % interval "
        "across the seeds of every metric) in output_dir; running it again continues; null = one run at seed",
    )
    output_dir: Optional[str] = knob(None, "run directory, locked while a run uses it; null = runs/<name>-<timestamp>")
    cache_dir: Optional[str] = knob(
        None,
        "folder of trained networks that depend only on the data, their settings and a seed (PLI's learned prior, the GAN "
        "inversions' WGAN-GP prior, the evaluation classifiers), shared by every run that names it and reused when their inputs "
        "match (a digest of all their training reads names each); a folder outside output_dir; `fdattack matrix` sets <root>/cache; "
        "null = none shared (the inversions' "
        "evaluation classifier kept in output_dir/artifacts)",
    )
    resume: bool = knob(False, "continue the run in output_dir after its last completed round")
    checkpoint_every: int = knob(1, "write a resumable checkpoint every N rounds (the last round always)", ge=1)
    keep_checkpoints: int = knob(2, "how many round checkpoints to keep (older ones are deleted)", ge=1)
    data: DataConfig = knob(DataConfig(), "the dataset and its federated split")
    model: ModelConfig = knob(ModelConfig(), "the client and server architectures")
    protocol: Any = None  # the protocol's own settings dataclass, chosen by protocol.name
    trainer: TrainerConfig = knob(TrainerConfig(), "where every phase trains")
    logger: LoggerConfig = knob(LoggerConfig(), "logging")
    attacks: list[str] = knob(
        ["pli", "tbi", "ldia"], "attacks run every round, by registry name (attacks=[] for none); each has its knobs under attack.<name>"
    )
    attack: Any = None  # attack.<name>: each registered attack's settings dataclass
    defenses: list[str] = knob(
        [], "defenses applied, in order, by registry name (e.g. defenses=[laplace]); each has its knobs under defense.<name>"
    )
    defense: Any = None  # defense.<name>: each registered defense's settings dataclass
    evaluation: EvaluationConfig = knob(EvaluationConfig(), "the evaluation side")
    isolation: IsolationConfig = knob(IsolationConfig(), "where the attacks run, and their budgets")
    plugins: list[str] = knob(
        [],
        "importable modules that register attacks, defenses or protocols, imported before the config is checked (packages that declare "
        "entry points in the groups fdattack.attacks, fdattack.defenses or fdattack.protocols are found without it); docs/plugins.md",
    )
