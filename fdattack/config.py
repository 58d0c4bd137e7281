"""Structured configs (OmegaConf dataclass schemas), composition and validation.

A run's config is composed in this order, later layers winning:

1. the dataclass defaults below (the embedded default is FedMD on scikit-learn's digits);
2. group files named in the experiment's ``defaults:`` list, then group tokens on the command
   line (``protocol=dsfl`` loads ``conf/protocol/dsfl.yaml`` into the ``protocol`` node);
3. the experiment YAML's own keys;
4. ``key=value`` dotlist overrides (``protocol.num_clients=10``).

The schema is struct-mode: a misspelt key or a value of the wrong type is a :class:`ConfigError`
naming the key. Protocol-specific keys live in one dataclass per protocol, chosen by
``protocol.name`` before the merge, so ``protocol.era_temperature`` exists only for DS-FL.
Every field's comment is its documentation (``fdattack run --help-config`` prints them).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fdattack.errors import ConfigError

PACKAGE_ROOT = Path(__file__).resolve().parent
REPO_CONF_DIR = PACKAGE_ROOT.parent / "conf"
GROUPS = ("data", "model", "protocol", "trainer", "logger")


# --------------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    name: str = "digits"  # dataset registry name: digits | mnist | att_faces | image_folder | cifar10 | cifar100 | fashion_mnist | celeba | synthetic
    root: Optional[str] = None  # folder of file-based datasets (mnist IDX files, att_faces sN/, image_folder); relative paths are taken from the working directory
    download: bool = False  # let torchvision download cifar10/cifar100/fashion_mnist/celeba/mnist into root (needs internet)
    image_size: Optional[int] = None  # resize images to image_size x image_size; null keeps the native size
    second_look_subdir: Optional[str] = None  # name=image_folder: subfolder of each identity holding its insensitive look (LAG: y)
    second_look_root: Optional[str] = None  # name=image_folder: parallel tree with the insensitive look under the same file names (masked LFW)
    max_per_class: Optional[int] = None  # keep at most this many random images of every label in the pool (the official test split is kept whole); null keeps all
    max_classes: Optional[int] = None  # keep only the max_classes labels with the most images (image_folder, celeba); null keeps all
    split: str = "pli"  # how public/private/test are formed: pli (target labels private, others public, auxiliary look public) | random (public_fraction of the pool public) | classes (public_classes public, the rest private)
    partition: str = "disjoint_identities"  # how private data is spread over clients: disjoint_identities | dirichlet | shards | iid | two_classes
    num_targets: Optional[int] = None  # split=pli: number of target (private) labels; null = half of the labels
    public_fraction: float = 0.2  # split=random: fraction of the training pool that becomes the public set
    public_classes: list[int] = field(default_factory=list)  # split=classes: labels that form the public set
    test_fraction: float = 0.2  # fraction of each private label's images held out as the test set (used when the dataset has no test split)
    dirichlet_alpha: float = 1.0  # partition=dirichlet: concentration alpha > 0 (smaller = more skewed)
    min_client_size: int = 1  # partition=dirichlet: redraw until every client has at least this many samples
    shards_per_client: int = 2  # partition=shards: label-sorted shards given to each client
    aux_domain: str = "blur"  # split=pli: how the insensitive public look is made: blur | second_look | none, or a registered domain transform
    blur_strength: int = 2  # aux_domain=blur: side of the normalized box kernel in pixels
    synthetic_num_classes: int = 10  # name=synthetic: number of classes
    synthetic_per_class: int = 20  # name=synthetic: images per class
    synthetic_image_size: int = 8  # name=synthetic: side length of the generated images
    synthetic_channels: int = 1  # name=synthetic: channels of the generated images
    label_space: str = "all"  # all (every label is an output class) | targets (only the target labels, remapped to 0..n-1; other public labels become -1, as PLI's DS-FL)
    seed: Optional[int] = None  # seed of the split and partition; null = the run seed


@dataclass
class ModelConfig:
    name: str = "pli_cnn"  # classifier registry name for every client: pli_cnn | fedinverse_cnn | pdafd_cnn | mlp | resnet18_gn | vgg16_bn | mobilenet_v2
    clients: list[str] = field(default_factory=list)  # per-client architectures, cycled over the clients (heterogeneous FD); empty = name for all
    server: Optional[str] = None  # architecture of the server model where the protocol has one; null = name


@dataclass
class OptimConfig:
    name: str = "adam"  # adam | sgd
    lr: float = 1e-3  # learning rate > 0
    weight_decay: float = 0.0  # L2 weight decay >= 0
    momentum: float = 0.0  # sgd momentum in [0, 1)
    nesterov: bool = False  # sgd Nesterov momentum
    batch_size: int = 64  # mini-batch size for every local phase
    fresh_per_phase: bool = False  # build a new optimizer at every phase instead of keeping one per model


@dataclass
class ProtocolConfig:
    name: str = "fedmd"  # fedmd | fedgems | dsfl | cronus | fedavg
    num_clients: int = 4  # K >= 1
    rounds: int = 5  # communication rounds T >= 1
    public_per_round: Optional[int] = None  # public samples drawn per round; null = all of the public set
    on_bad_upload: str = "error"  # what a NaN/inf upload does: error (stop with a message) | drop (leave that client out of the round and record it)
    optim: OptimConfig = field(default_factory=OptimConfig)  # optimizer of clients and server


@dataclass
class FedMDConfig(ProtocolConfig):
    name: str = "fedmd"
    transfer_public_epochs: int = 5  # transfer phase: epochs of CE on the labeled public set, before round 1
    transfer_private_epochs: int = 5  # transfer phase: epochs of CE on the private set, before round 1
    digest_epochs: int = 1  # per round: epochs of L1 to the consensus on the public set (skipped when K = 1)
    revisit_epochs: int = 1  # per round: epochs of CE on the private set
    server_model: bool = True  # train the attacker-added server model f_0 on the labeled public set (PLI Eq. 1)
    server_epochs: int = 1  # per round: epochs of the server model on the public set


@dataclass
class FedGEMSConfig(ProtocolConfig):
    name: str = "fedgems"
    private_epochs: int = 2  # per round: client epochs of CE on the private set
    public_epochs: int = 2  # per round: client epochs of eps*CE + (1-eps)*KL to the server logits on the public set
    server_epochs: int = 1  # per round: server epochs of selective knowledge fusion
    epsilon: float = 0.75  # weight of CE against KL, in [0, 1]
    kl_mode: str = "code"  # code (nn.KLDivLoss mean, teacher in the log slot, as the authors' code) | standard (batchmean KL(teacher||student))


@dataclass
class DSFLConfig(ProtocolConfig):
    name: str = "dsfl"
    warmup_private_epochs: int = 0  # epochs of CE on the private set before round 1
    private_epochs: int = 2  # per round: client epochs of CE on the private set
    distill_epochs: int = 2  # per round: client epochs of soft CE to the ERA labels (skipped when K = 1)
    server_epochs: int = 1  # per round: global-model epochs of soft CE to the ERA labels
    train_global_model: bool = True  # train DS-FL's global model (the server model f_0)
    era_temperature: float = 0.1  # ERA sharpening temperature > 0
    upload: str = "probs"  # what clients send: probs (softmax, PLI's DS-FL) | logits (server applies softmax, PDA-FD)


@dataclass
class CronusConfig(ProtocolConfig):
    name: str = "cronus"
    warmup_private_epochs: int = 0  # epochs of CE on the private set before round 1
    private_epochs: int = 5  # per round: local-update epochs of CE on the private set
    kd_epochs: int = 10  # per round: epochs of KL to the robust-mean probabilities on the public subset
    mixed_kd: bool = False  # one kd_epochs phase on private + public mixed, instead of separate phases
    filter_eps: float = 0.1  # Diakonikolas filter: assumed corrupted fraction in (0, 0.5)
    filter_tau: float = 0.1  # Diakonikolas filter: confidence in (0, 1)


@dataclass
class FedAvgConfig(ProtocolConfig):
    name: str = "fedavg"
    fraction: float = 1.0  # C: fraction of clients sampled per round, in (0, 1]
    local_epochs: int = 1  # E: local epochs per round
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(name="sgd", lr=0.01, batch_size=10, fresh_per_phase=True))


PROTOCOL_SCHEMAS: dict[str, type[ProtocolConfig]] = {
    "fedmd": FedMDConfig,
    "fedgems": FedGEMSConfig,
    "dsfl": DSFLConfig,
    "cronus": CronusConfig,
    "fedavg": FedAvgConfig,
}


@dataclass
class TrainerConfig:
    accelerator: str = "cpu"  # cpu | gpu | cuda | mps | auto (Lightning Fabric accelerator)
    devices: Any = 1  # number of devices (or a list of ids, or "auto")
    strategy: str = "auto"  # auto | ddp | ddp_spawn | fsdp ... (Lightning strategy)
    num_nodes: int = 1  # nodes for multi-node DDP (torchrun or SLURM launch the ranks)
    precision: str = "32-true"  # Lightning precision, e.g. 32-true | bf16-mixed | 16-mixed


@dataclass
class WandbConfig:
    mode: str = "auto"  # auto (online with credentials, else offline) | online | offline | disabled
    project: str = "fdattack"  # W&B project
    entity: Optional[str] = None  # W&B entity (team or user)
    group: Optional[str] = None  # W&B run group
    tags: list[str] = field(default_factory=list)  # W&B run tags
    name: Optional[str] = None  # W&B run name; null = the experiment name


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)
    progress: str = "auto"  # progress bar over rounds and phases: auto (only on a TTY) | always | never (not on/off: YAML reads those as booleans)
    level: str = "INFO"  # stdlib logging level


@dataclass
class ConfidenceGapConfig:
    enabled: bool = True  # log entropy histograms of client and server outputs on public and private data (PLI spec section 6)
    bins: int = 20  # histogram bins over [0, log J]
    max_samples: int = 512  # samples per data set used for the histograms


@dataclass
class ObserversConfig:
    confidence_gap: ConfidenceGapConfig = field(default_factory=ConfidenceGapConfig)


@dataclass
class EvaluationConfig:
    classifier: Optional[str] = "pdafd_cnn"  # evaluation classifier over the target labels, trained on their private images apart from the federated models (top-1/top-5 of reconstructions); a classifier registry name, or null for none
    epochs: int = 30  # its training epochs
    lr: float = 1e-3  # its Adam learning rate


@dataclass
class PriorConfig:
    kind: str = "auto"  # PLI prior x̄_j (pli.md §7.4): naive (Eq. 8, mean sensitive public image) | learned (Eq. 9, translated insensitive public images per label; needs every public label) | auto (learned where the protocol gives the attacker every public label, naive for DS-FL / data.label_space=targets)
    translator: str = "auto"  # learned prior's translation model: restorer (paired, for a known degradation such as blur) | cyclegan (unpaired looks) | auto (restorer when data.aux_domain is a transform, cyclegan for second_look)
    epochs: int = 10  # translation-model training epochs over its public pairs (paper: 100, batch 1)
    lr: Optional[float] = 1e-3  # translation-model Adam learning rate, set for batch 8 and short CPU runs; null = the paper's 1e-4 (restorer) / 2e-4 (cyclegan), pli.md §13.10
    batch_size: int = 8  # translation-model batch size (1 in the paper)
    width: int = 32  # ngf = ndf of the translation networks (64 in the paper's code)
    pairs_per_label: int = 100  # training pairs drawn per public label: restorer (degrade(x), x) for x in D_0; cyclegan (insensitive, sensitive) of each non-target identity


@dataclass
class AttackConfig:
    tau: float = 3.0  # softmax temperature of the inversion inputs (PLI and TBI), > 0
    gamma: float = 0.03  # PLI prior weight (Eqs. 3 and 10), >= 0
    alpha: float = 5.0  # PLI entropy weight in Q (Eq. 4), > 0
    beta: float = 0.1  # PLI TV weight in the client selection (Eq. 11), >= 0
    lr: float = 3e-5  # inversion-network Adam learning rate
    weight_decay: float = 1e-4  # inversion-network Adam weight decay
    batch_size: int = 8  # inversion-network batch size
    epochs_per_round: int = 3  # inversion epochs per communication round
    max_width: int = 1024  # widest inversion-network feature map (1024 in the paper)
    variant: str = "full"  # PLI ablation (pli.md §8.2, Table 3): full | client_only (G sees client probabilities only, reconstructs from one-hot(j))
    finetune: bool = True  # PLI: Eq. 10 fine-tuning on the optimal inputs after every Eq. 3 epoch (skipped anyway when gamma = 0)
    prior: PriorConfig = field(default_factory=PriorConfig)
    tbi_last_client_only: bool = False  # TBI: reproduce the authors' closure bug (all outputs from the last client)


@dataclass
class ExperimentConfig:
    name: str = "fedmd_digits"  # experiment name (run directory prefix, W&B run name)
    seed: int = 42  # seed of everything (model init, shuffling, splits unless data.seed is set)
    output_dir: Optional[str] = None  # run directory; null = runs/<name>-<timestamp>
    resume: bool = False  # continue the run in output_dir after its last completed round
    checkpoint_every: int = 1  # write a resumable checkpoint every N rounds (the last round always)
    keep_checkpoints: int = 2  # how many round checkpoints to keep (older ones are deleted), >= 1
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    protocol: ProtocolConfig = field(default_factory=FedMDConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    observers: ObserversConfig = field(default_factory=ObserversConfig)
    attacks: list[str] = field(default_factory=lambda: ["pli", "tbi"])  # attacks run every round: pli, tbi (attacks=[] for none)
    attack: AttackConfig = field(default_factory=AttackConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)


# --------------------------------------------------------------------------------------------
# Composition
# --------------------------------------------------------------------------------------------
def _omegaconf_error(err: OmegaConfBaseException, source: str, protocol_name: str) -> ConfigError:
    """Translate an OmegaConf error into one line naming the key."""
    key = getattr(err, "full_key", None) or getattr(err, "key", None) or "?"
    msg = str(err).splitlines()[0]
    if "not in" in msg or "Key '" in msg and "not" in msg:
        parent, _, leaf = str(key).rpartition(".")
        hint = f" with protocol.name={protocol_name}" if parent == "protocol" else ""
        return ConfigError(f"{source}: unknown config key '{key}'{hint}" + (f" (see `fdattack run --help-config` for the keys under '{parent}')" if parent else ""))
    if "could not be converted" in msg or "Value '" in msg or "Invalid type" in msg or "Cannot assign" in msg:
        return ConfigError(f"{source}: {key}: {msg}")
    return ConfigError(f"{source}: {key}: {msg}")


def _load_yaml(path: Path, what: str) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"{what} file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except Exception as err:  # yaml.YAMLError and OmegaConf errors alike
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: must hold a mapping of config keys, not a {type(loaded).__name__}")
    return loaded


def conf_dirs() -> list[Path]:
    """Folders searched for group files: ``./conf`` then the repository's ``conf/``."""
    dirs = [Path.cwd() / "conf", REPO_CONF_DIR]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d not in dirs[:i]]


def _group_file(group: str, name: str) -> Path:
    for base in conf_dirs():
        candidate = base / group / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    available = sorted({p.stem for base in conf_dirs() for p in (base / group).glob("*.yaml")})
    raise ConfigError(f"{group}={name!r}: no file conf/{group}/{name}.yaml; available: {', '.join(available) or 'none'}")


def _split_tokens(overrides: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Separate group tokens (``protocol=dsfl``) from dotlist value overrides."""
    groups: list[tuple[str, str]] = []
    dotlist: list[str] = []
    for token in overrides:
        if "=" not in token:
            raise ConfigError(f"override {token!r} is not of the form key=value")
        key, value = token.split("=", 1)
        if key in GROUPS and value and not value.startswith("{"):
            groups.append((key, value))
        else:
            dotlist.append(token)
    return groups, dotlist


def _schema_for(protocol_name: str) -> DictConfig:
    if protocol_name not in PROTOCOL_SCHEMAS:
        known = ", ".join(sorted(PROTOCOL_SCHEMAS))
        raise ConfigError(f"protocol.name={protocol_name!r} is not a known protocol; choose one of: {known}")
    root = ExperimentConfig(protocol=PROTOCOL_SCHEMAS[protocol_name]())
    schema = OmegaConf.structured(root)
    OmegaConf.set_struct(schema, True)
    return schema


def compose(experiment: str | Path | None = None, overrides: list[str] | None = None) -> DictConfig:
    """Compose, type-check and range-check a run config.

    Args:
        experiment: path to an experiment YAML, or None for the embedded default.
        overrides: dotlist tokens ``key=value`` and group tokens ``group=name``.

    Returns:
        The resolved, read-only config.

    Raises:
        ConfigError: naming the key or file that is wrong and what is allowed.
    """
    overrides = list(overrides or [])
    group_tokens, dotlist = _split_tokens(overrides)
    layers: list[tuple[str, DictConfig]] = []
    exp_cfg: DictConfig | None = None
    if experiment is not None:
        exp_path = Path(experiment)
        exp_cfg = _load_yaml(exp_path, "experiment")
        defaults = exp_cfg.pop("defaults", None)
        if defaults is not None:
            if not isinstance(defaults, (DictConfig, ListConfig)):
                raise ConfigError(f"{exp_path}: 'defaults' must be a mapping group: name")
            items = defaults.items() if isinstance(defaults, DictConfig) else [next(iter(d.items())) for d in defaults]
            for group, name in items:
                if group not in GROUPS:
                    raise ConfigError(f"{exp_path}: defaults group {group!r} unknown; groups are {', '.join(GROUPS)}")
                layers.append((str(_group_file(group, str(name))), OmegaConf.create({group: _load_yaml(_group_file(group, str(name)), group)})))
    for group, name in group_tokens:
        path = _group_file(group, name)
        layers.append((str(path), OmegaConf.create({group: _load_yaml(path, group)})))
    if exp_cfg is not None:
        layers.append((str(experiment), exp_cfg))
    try:
        dot_cfg = OmegaConf.from_dotlist(dotlist)
    except OmegaConfBaseException as err:
        raise ConfigError(f"command line: {str(err).splitlines()[0]}") from None
    layers.append(("command line", dot_cfg))

    protocol_name = "fedmd"
    for _, layer in layers:
        name = OmegaConf.select(layer, "protocol.name", default=None)
        if name is not None:
            protocol_name = str(name)
    cfg = _schema_for(protocol_name)
    for source, layer in layers:
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as err:
            raise _omegaconf_error(err, source, protocol_name) from None
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err, "config", protocol_name) from None
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def load_config(experiment: str | Path | None = None, overrides: list[str] | None = None) -> DictConfig:
    """Notebook helper: the same composition as the CLI (``fdattack run EXPERIMENT k=v ...``)."""
    return compose(experiment, overrides)


# --------------------------------------------------------------------------------------------
# Range validation
# --------------------------------------------------------------------------------------------
def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is out of range; allowed: {allowed}")


def _choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    _check(value in allowed, key, value, " | ".join(allowed))


def validate(cfg: DictConfig) -> None:
    """Check ranges and choices that types alone cannot express.

    Raises:
        ConfigError: the first offending key, its value and what is allowed.
    """
    p, d, o = cfg.protocol, cfg.data, cfg.protocol.optim
    _check(p.num_clients >= 1, "protocol.num_clients", p.num_clients, "an integer >= 1")
    _check(d.max_per_class is None or d.max_per_class >= 2, "data.max_per_class", d.max_per_class, "null or an integer >= 2")
    _check(p.rounds >= 1, "protocol.rounds", p.rounds, "an integer >= 1")
    _check(p.public_per_round is None or p.public_per_round >= 1, "protocol.public_per_round", p.public_per_round, "null or an integer >= 1")
    _choice(cfg, "protocol.on_bad_upload", ("error", "drop"))
    _choice(cfg, "protocol.optim.name", ("adam", "sgd"))
    _check(o.lr > 0 and math.isfinite(o.lr), "protocol.optim.lr", o.lr, "a finite number > 0")
    _check(o.weight_decay >= 0, "protocol.optim.weight_decay", o.weight_decay, ">= 0")
    _check(0 <= o.momentum < 1, "protocol.optim.momentum", o.momentum, "[0, 1)")
    _check(o.batch_size >= 1, "protocol.optim.batch_size", o.batch_size, "an integer >= 1")
    for key in ("transfer_public_epochs", "transfer_private_epochs", "digest_epochs", "revisit_epochs", "server_epochs",
                "private_epochs", "public_epochs", "distill_epochs", "warmup_private_epochs", "kd_epochs", "local_epochs"):
        if key in p:
            _check(p[key] >= 0, f"protocol.{key}", p[key], "an integer >= 0")
    if p.name == "fedgems":
        _check(0 <= p.epsilon <= 1, "protocol.epsilon", p.epsilon, "[0, 1]")
        _choice(cfg, "protocol.kl_mode", ("code", "standard"))
    if p.name == "dsfl":
        _check(p.era_temperature > 0, "protocol.era_temperature", p.era_temperature, "a number > 0")
        _choice(cfg, "protocol.upload", ("probs", "logits"))
    if p.name == "cronus":
        _check(0 < p.filter_eps < 0.5, "protocol.filter_eps", p.filter_eps, "(0, 0.5)")
        _check(0 < p.filter_tau < 1, "protocol.filter_tau", p.filter_tau, "(0, 1)")
    if p.name == "fedavg":
        _check(0 < p.fraction <= 1, "protocol.fraction", p.fraction, "(0, 1]")

    _choice(cfg, "data.split", ("pli", "random", "classes"))
    _choice(cfg, "data.label_space", ("all", "targets"))
    _choice(cfg, "data.partition", ("disjoint_identities", "dirichlet", "shards", "iid", "two_classes"))
    _check(d.dirichlet_alpha > 0 and math.isfinite(d.dirichlet_alpha), "data.dirichlet_alpha", d.dirichlet_alpha, "a finite number > 0")
    _check(0 < d.public_fraction < 1, "data.public_fraction", d.public_fraction, "(0, 1)")
    _check(0 <= d.test_fraction < 1, "data.test_fraction", d.test_fraction, "[0, 1)")
    _check(d.num_targets is None or d.num_targets >= 1, "data.num_targets", d.num_targets, "null or an integer >= 1")
    _check(d.max_classes is None or d.max_classes >= 2, "data.max_classes", d.max_classes, "null or an integer >= 2")
    _check(d.image_size is None or d.image_size >= 4, "data.image_size", d.image_size, "null or an integer >= 4")
    _check(d.min_client_size >= 0, "data.min_client_size", d.min_client_size, "an integer >= 0")
    _check(d.shards_per_client >= 1, "data.shards_per_client", d.shards_per_client, "an integer >= 1")
    _check(d.blur_strength >= 1, "data.blur_strength", d.blur_strength, "an integer >= 1")
    _check(d.synthetic_num_classes >= 2, "data.synthetic_num_classes", d.synthetic_num_classes, "an integer >= 2")
    _check(d.synthetic_per_class >= 2, "data.synthetic_per_class", d.synthetic_per_class, "an integer >= 2")
    _check(d.synthetic_image_size >= 4, "data.synthetic_image_size", d.synthetic_image_size, "an integer >= 4")
    _check(d.synthetic_channels in (1, 3), "data.synthetic_channels", d.synthetic_channels, "1 or 3")
    if d.root is not None and d.name not in ("digits", "synthetic") and not d.download and not Path(d.root).expanduser().is_dir():
        raise ConfigError(f"data.root={d.root!r}: folder not found (give the folder holding the {d.name} files, or data.download=true where torchvision can download it)")

    _check(cfg.checkpoint_every >= 1, "checkpoint_every", cfg.checkpoint_every, "an integer >= 1")
    _check(cfg.keep_checkpoints >= 1, "keep_checkpoints", cfg.keep_checkpoints, "an integer >= 1")
    _choice(cfg, "logger.wandb.mode", ("auto", "online", "offline", "disabled"))
    _choice(cfg, "logger.progress", ("auto", "always", "never"))
    _choice(cfg, "logger.level", ("DEBUG", "INFO", "WARNING", "ERROR"))
    a = cfg.attack
    for name in cfg.attacks:
        _check(name in ("pli", "tbi"), "attacks", list(cfg.attacks), "a list of: pli, tbi")
        allowed = ("fedmd", "fedgems", "dsfl") if name == "pli" else ("fedmd", "fedgems", "dsfl", "cronus")
        if p.name not in allowed:
            raise ConfigError(f"attacks: {name} attacks federated distillation ({', '.join(allowed)}), not protocol.name={p.name}; set attacks=[]")
        if name == "pli" and p.name == "fedmd" and not p.server_model:
            raise ConfigError("attacks: pli needs the attacker's server model; set protocol.server_model=true")
    _choice(cfg, "attack.variant", ("full", "client_only"))
    ev = cfg.evaluation
    _check(ev.epochs >= 1 and ev.lr > 0, "evaluation.epochs/lr", (ev.epochs, ev.lr), "epochs >= 1, lr > 0")
    _choice(cfg, "attack.prior.kind", ("auto", "naive", "learned"))
    _choice(cfg, "attack.prior.translator", ("auto", "restorer", "cyclegan"))
    pr = a.prior
    _check(pr.epochs >= 0 and pr.batch_size >= 1 and pr.width >= 1 and pr.pairs_per_label >= 1, "attack.prior.epochs/batch_size/width/pairs_per_label",
           (pr.epochs, pr.batch_size, pr.width, pr.pairs_per_label), "epochs >= 0, batch_size >= 1, width >= 1, pairs_per_label >= 1")
    _check(pr.lr is None or pr.lr > 0, "attack.prior.lr", pr.lr, "null or a number > 0")
    _check(a.tau > 0, "attack.tau", a.tau, "a number > 0")
    _check(a.gamma >= 0, "attack.gamma", a.gamma, ">= 0")
    _check(a.alpha > 0, "attack.alpha", a.alpha, "a number > 0")
    _check(a.beta >= 0, "attack.beta", a.beta, ">= 0")
    _check(a.lr > 0, "attack.lr", a.lr, "a number > 0")
    _check(a.batch_size >= 1 and a.epochs_per_round >= 0 and a.max_width >= 8, "attack.batch_size/epochs_per_round/max_width",
           (a.batch_size, a.epochs_per_round, a.max_width), "batch_size >= 1, epochs_per_round >= 0, max_width >= 8")
    _check(cfg.trainer.num_nodes >= 1, "trainer.num_nodes", cfg.trainer.num_nodes, "an integer >= 1")
    _check(cfg.observers.confidence_gap.bins >= 2, "observers.confidence_gap.bins", cfg.observers.confidence_gap.bins, "an integer >= 2")


# --------------------------------------------------------------------------------------------
# Documentation of every key (``fdattack run --help-config``)
# --------------------------------------------------------------------------------------------
def _field_docs(schema: type, prefix: str) -> list[tuple[str, str, str]]:
    """(key, default, comment) for every leaf field, read from the dataclass source comments."""
    import inspect

    source_lines = inspect.getsource(schema).splitlines()
    comments: dict[str, str] = {}
    for line in source_lines:
        stripped = line.strip()
        if ":" in stripped and "#" in stripped and not stripped.startswith(("#", "class ", '"')):
            name = stripped.split(":", 1)[0].strip()
            comments[name] = stripped.split("#", 1)[1].strip()
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            rows.extend(_field_docs(type(default), key + "."))
            continue
        # inherited fields: look the comment up in the base classes
        comment = comments.get(f.name)
        for base in schema.__mro__[1:]:
            if comment is None and dataclasses.is_dataclass(base):
                comment = dict((k.rsplit(".", 1)[-1], c) for k, _, c in _field_docs(base, "")).get(f.name)
        rows.append((key, repr(default), comment or ""))
    return rows


def help_config() -> str:
    """Every config key with its default and meaning, grouped as in the schema."""
    rows = [r for r in _field_docs(ExperimentConfig, "") if not r[0].startswith("protocol.")]
    rows += _field_docs(ProtocolConfig, "protocol.")
    lines = ["Config keys (set with key=value; group files with group=name):", ""]
    width = max(len(k) for k, _, _ in rows) + 2
    lines += [f"  {k:<{width}}{dflt:<12} {c}" for k, dflt, c in rows]
    base_keys = {k for k, _, _ in _field_docs(ProtocolConfig, "protocol.")}
    for name, schema in PROTOCOL_SCHEMAS.items():
        extra = [r for r in _field_docs(schema, "protocol.") if r[0] not in base_keys]
        lines += ["", f"protocol.name={name}:"] + [f"  {k:<{width}}{dflt:<12} {c}" for k, dflt, c in extra]
    lines += ["", "protocol.name=fedavg changes the optimizer defaults to sgd, lr=0.01, batch_size=10, fresh_per_phase=true."]
    return "\n".join(lines)
