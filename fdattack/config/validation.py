"""Validation of a composed config: every field's range, the registry names, what needs what.

Ranges live next to the fields (:func:`fdattack.knobs.knob`); choices are enums that OmegaConf
checks on merge. What is left here: names of components, checks across fields, and compatibility,
decided from the components' declarations (an attack's or defense's needs against the protocol's
offers, :class:`~fdattack.fd.threat.Capability`), never from lists of names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS
from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, ListConfig, OmegaConf

from fdattack.config.registries import registries
from fdattack.config.schema import SEED_MAX
from fdattack.data import partitions
from fdattack.data.public import check_public_dataset
from fdattack.defenses.dpsgd import require_opacus
from fdattack.errors import ConfigError
from fdattack.fd.evasion import evasive_clients
from fdattack.fd.threat import Capability
from fdattack.knobs import check_ranges
from fdattack.vocabulary import CAPABILITY_TEXT, DATA_CAPABILITIES

#: where each dataset that is not downloaded comes from, for the line that says its folder is missing
DATA_SOURCES = {
    "att_faces": (
        "the AT&T (ORL) faces, folders s1 ... s40 of ten .pgm images, are not downloaded: put them in <folder>/att_faces and set "
        "FDATTACK_DATA=<folder> (or data.root=<their folder>)"
    ),
    "mnist": (
        "the MNIST IDX files (t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]) go in <folder>/mnist_t10k with "
        "FDATTACK_DATA=<folder> (or data.root=<their folder>), or data.download=true has torchvision fetch them"
    ),
    "image_folder": (
        "a face set of one folder per identity (LFW, LAG, FaceScrub) is not downloaded: put it under <folder> as its "
        "conf/data file's first lines say and set FDATTACK_DATA=<folder> (or data.root=<its folder>)"
    ),
}
OTHER_SOURCE = "give the folder holding the dataset's files as data.root, or data.download=true where torchvision can download it"


def validate(cfg: DictConfig) -> None:
    """Check ranges, names, the trainer and compatibility that types alone cannot express.

    Raises:
        ConfigError: the first offending key, its value and what is allowed.
    """
    check_ranges(cfg, "")
    check_seeds(cfg.seeds)
    check_names(cfg)
    check_trainer(cfg.trainer)
    check_vectorise(cfg)
    check_isolation(cfg)
    check_cache_dir(cfg)
    if "dpsgd" in cfg.defenses:
        require_opacus()  # the optional ``dp`` extra: one line before anything loads
    d = cfg.data
    if d.root is not None and d.name not in ("digits", "synthetic") and not d.download and not Path(d.root).expanduser().is_dir():
        raise ConfigError(f"data.root={d.root!r}: folder not found; {DATA_SOURCES.get(str(d.name), OTHER_SOURCE)} (docs/data.md)")
    check_public_dataset(d)
    check_compatibility(cfg)
    check_sizes(cfg)
    check_membership(cfg)
    check_batch_norm(cfg)


def check_cache_dir(cfg: DictConfig) -> None:
    """``cache_dir`` is a folder (or can be made one) outside ``output_dir``, whose top holds one run's files only (a
    cache there would make the run refuse its own folder on resume)."""
    if cfg.cache_dir is None:
        return
    cache = Path(str(cfg.cache_dir)).expanduser().absolute()
    blocking = next((p for p in (cache, *cache.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ConfigError(f"cache_dir={cfg.cache_dir!r}: {blocking} is a file, not a folder; name a folder for the cache, or null")
    if cfg.output_dir is not None:
        output = Path(str(cfg.output_dir)).expanduser().absolute()
        if cache == output or output in cache.parents:
            raise ConfigError(
                f"cache_dir={cfg.cache_dir!r} lies inside output_dir={cfg.output_dir!r}, which holds one run's files only; "
                "put the cache beside it (e.g. cache_dir=runs/cache)"
            )


def check_seeds(seeds: Any) -> None:
    """``seeds``: null, or distinct seeds in [0, 2³²−1], at least one."""
    if seeds is None:
        return
    values = list(seeds)
    if not values:
        raise ConfigError("seeds=[] names no seed; give at least one (seeds=[0,1,2]) or leave it null for one run at seed")
    bad = next((s for s in values if not 0 <= s <= SEED_MAX), None)
    if bad is not None:
        raise ConfigError(f"seeds: {bad} is out of range; allowed: integers in [0, {SEED_MAX}]")
    if len(set(values)) < len(values):
        raise ConfigError(f"seeds={values} repeats a seed; each replica needs its own")


def check_names(cfg: DictConfig) -> None:
    """Every registry name in the config is registered; the error names its own key (``model.clients[1]``).

    Raises:
        ConfigError: ``model.clients[1]='bogus' is not a known classifier; choose one of: ...``
    """
    from fdattack.data.datasets import DATASETS
    from fdattack.data.domains import DOMAIN_TRANSFORMS
    from fdattack.models import CLASSIFIERS

    _, attacks, defenses = registries()
    DATASETS.get(cfg.data.name)
    looks = ("none", "second_look")  # made by the dataset, not by a transform
    if cfg.data.aux_domain not in looks and cfg.data.aux_domain not in DOMAIN_TRANSFORMS:
        raise ConfigError(
            f"data.aux_domain={cfg.data.aux_domain!r} is not known; choose one of: {', '.join(sorted([*DOMAIN_TRANSFORMS, *looks]))}"
        )
    models = [
        ("model.name", cfg.model.name),
        *((f"model.clients[{i}]", n) for i, n in enumerate(cfg.model.clients)),
        ("model.server", cfg.model.server),
        ("evaluation.classifier", cfg.evaluation.classifier),
        ("evaluation.inversion.classifier", cfg.evaluation.inversion.classifier),
    ]
    for key, name in models:
        if name is not None:
            CLASSIFIERS.get(name, key)
    for key, registry in (("attacks", attacks), ("defenses", defenses)):
        for i, name in enumerate(cfg[key]):
            registry.get(name, f"{key}[{i}]")


def check_trainer(trainer: DictConfig) -> None:
    """The accelerator exists on this machine; Lightning knows the strategy and precision and takes the devices.

    Checked before anything is built, against Lightning's own lists.

    Raises:
        ConfigError: ``trainer.accelerator='gpu': no GPU on this machine; available here: auto, cpu``
    """
    accelerator = _accelerator_here(str(trainer.accelerator))
    strategies = ["auto", *STRATEGY_REGISTRY.available_strategies()]
    if str(trainer.strategy).lower() not in strategies:
        raise ConfigError(f"trainer.strategy={trainer.strategy!r} is not a Lightning strategy; choose one of: {', '.join(strategies)}")
    precisions = [*get_args(_PRECISION_INPUT_STR), *get_args(_PRECISION_INPUT_STR_ALIAS)]
    if str(trainer.precision) not in precisions:
        raise ConfigError(f"trainer.precision={trainer.precision!r} is not a Lightning precision; choose one of: {', '.join(precisions)}")
    devices = OmegaConf.to_object(trainer.devices) if isinstance(trainer.devices, ListConfig) else trainer.devices
    problem = _device_problem(ACCELERATOR_REGISTRY[accelerator]["accelerator"], devices)
    if problem:
        raise ConfigError(f"trainer.devices={devices!r} with trainer.accelerator={accelerator}: {problem}")


def check_isolation(cfg: DictConfig) -> None:
    """The attack workers' keys: budgets and overlap apply to workers only; workers run beside one process, not under DDP; the
    memory budget reads ``/proc``.

    Raises:
        ConfigError: ``isolation.seconds=60.0: budgets apply to attack workers; set isolation.mode=process``
    """
    iso, t = cfg.isolation, cfg.trainer
    if iso.mode != "process":
        for key in ("seconds", "memory_mb"):
            if iso[key] is not None:
                raise ConfigError(f"isolation.{key}={iso[key]}: budgets apply to attack workers; set isolation.mode=process")
        if iso.overlap:
            raise ConfigError("isolation.overlap=true: only attack workers end rounds beside the simulation; set isolation.mode=process")
        return
    devices, processes = _processes(t)
    if processes > 1 or str(t.strategy).startswith(("ddp", "fsdp", "deepspeed")):
        raise ConfigError(
            f"isolation.mode=process runs each attack in a worker beside one process, not {processes} (trainer.devices={devices!r}, "
            f"trainer.num_nodes={t.num_nodes}, trainer.strategy={t.strategy}); use isolation.mode=in_process with DDP"
        )
    if iso.memory_mb is not None and not Path("/proc/self/status").is_file():
        raise ConfigError(f"isolation.memory_mb={iso.memory_mb}: this system has no /proc to read a worker's memory from; set it to null")


def check_vectorise(cfg: DictConfig) -> None:
    """``trainer.vectorise=true`` is refused where the vectorised path cannot apply at all (:mod:`fdattack.engine.vectorised`).

    Raises:
        ConfigError: ``trainer.vectorise=true: ... runs 2 processes (DDP) ...; use trainer.vectorise=auto or false``
    """
    t = cfg.trainer
    if t.vectorise is not True:
        return
    devices, processes = _processes(t)
    _, _, defenses = registries()
    from fdattack.defenses.base import TrainingDefense

    training = [name for name in cfg.defenses if issubclass(defenses.get(name), TrainingDefense) and not defenses.get(name).vectorised]
    problem = (
        f"trainer.devices={devices!r} and trainer.num_nodes={t.num_nodes} run {processes} processes (DDP)"
        if processes > 1
        else f"trainer.precision={t.precision!r} is not 32-true"
        if str(t.precision) not in ("32-true", "32")
        else f"defenses={training} wrap the clients' training in a way the vectorised path does not take"
        if training
        else None
    )
    if problem:
        raise ConfigError(
            f"trainer.vectorise=true: the clients cannot train as one vmapped batch: {problem}; use trainer.vectorise=auto or false"
        )


def _processes(t: DictConfig) -> tuple[Any, int]:
    """``trainer.devices`` as given, and how many processes (DDP ranks) the trainer runs."""
    accelerator = ACCELERATOR_REGISTRY[_accelerator_here(str(t.accelerator))]["accelerator"]
    devices = OmegaConf.to_object(t.devices) if isinstance(t.devices, ListConfig) else t.devices
    parsed = accelerator.auto_device_count() if devices == "auto" else accelerator.parse_devices(devices)
    return devices, (len(parsed) if isinstance(parsed, list) else int(parsed)) * int(t.num_nodes)


def _accelerator_here(requested: str) -> str:
    """The Lightning accelerator that ``trainer.accelerator=requested`` selects on this machine (auto and gpu resolved).

    Raises:
        ConfigError: the name is unknown to Lightning, or that accelerator is not on this machine.
    """
    known = ACCELERATOR_REGISTRY.available_accelerators()
    here = [name for name in ("tpu", "mps", "cuda", "cpu") if name in known and ACCELERATOR_REGISTRY[name]["accelerator"].is_available()]
    gpus = [name for name in here if name in ("mps", "cuda")]  # Lightning's order for accelerator=gpu
    allowed = f"available here: {', '.join(['auto', *(['gpu'] if gpus else []), *here])}"
    name = requested.lower()
    if name not in ("auto", "gpu", *known):
        raise ConfigError(f"trainer.accelerator={requested!r} is not a Lightning accelerator; {allowed}")
    if name == "gpu" and not gpus:
        raise ConfigError(f"trainer.accelerator={requested!r}: no GPU on this machine; {allowed}")
    if name not in ("auto", "gpu", *here):
        raise ConfigError(f"trainer.accelerator={requested!r}: not available on this machine; {allowed}")
    return here[0] if name == "auto" else gpus[0] if name == "gpu" else name


def _device_problem(accelerator: Any, devices: Any) -> str | None:
    """Why Lightning's ``accelerator.parse_devices`` refuses ``devices``, or None."""
    if devices == "auto":
        return None
    if devices in ([], 0, "0"):
        return "select at least one device (a number >= 1, a list of device ids, or 'auto')"
    try:
        accelerator.parse_devices(devices)
    except (TypeError, ValueError, MisconfigurationException) as err:
        return " ".join(str(err).split())
    return None


def _unique(key: str, names: list[str]) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{key}={names}: {', '.join(repeated)} listed twice")


def data_offers(data: DictConfig) -> frozenset[Capability]:
    """What the data split offers an attack (:data:`~fdattack.fd.threat.DATA_CAPABILITIES`): target labels without public
    images where the split keeps the targets out of the public set (``split=pli``, ``split=classes``, or a public set from
    another dataset), targets fixed by the config where every private class is one (not ``split=pli``, which draws them
    with the seed), and the attacker's own labeled prior data where ``split=classes`` gives it the public classes."""
    offered = set()
    if data.split in ("pli", "classes") or data.public_dataset.name is not None:
        offered.add(Capability.private_targets)
    if data.split == "classes" or data.split != "pli" and data.public_dataset.name is not None:
        offered.add(Capability.fixed_targets)
    if data.split == "classes":
        offered.add(Capability.prior_data)
    return frozenset(offered)


#: how to get what the data split does not offer
DATA_HINTS = {
    Capability.private_targets: "set data.split=pli or data.split=classes (or a public set from another dataset, data.public_dataset.name)",
    Capability.prior_data: "set data.split=classes and data.public_classes (the attacker's prior data)",
    Capability.fixed_targets: "set data.split=classes and data.public_classes (data=digits_lattack), or a public set of another dataset",
}


def unmet_needs(cfg: DictConfig, key: str, name: str) -> str | None:
    """Why attack or defense ``name`` (``key`` is ``attacks`` or ``defenses``) cannot run in ``cfg``, in one line naming
    what it needs, who does not offer it and how to get it; None when the protocol and the data split offer all it needs.

    Decided from the declarations alone: the component's needs (an attack's :meth:`~fdattack.attacks.base.Attack.required`
    with its settings) against the protocol's :meth:`offers` and the split's :func:`data_offers`, and an attack's
    :attr:`~fdattack.attacks.base.Attack.min_clients` against ``protocol.num_clients``.
    """
    protocols, attacks, defenses = registries()
    protocol = protocols.get(cfg.protocol.name)
    component = (attacks if key == "attacks" else defenses).get(name)
    needs = component.required(OmegaConf.to_object(cfg.attack[name])) if key == "attacks" else component.needs
    missing = sorted(needs - protocol.offers(cfg.protocol) - data_offers(cfg.data), key=lambda c: c.value)
    from_protocol = [c for c in missing if c not in DATA_CAPABILITIES]  # the protocol's shortfall first: no split makes up for it
    if from_protocol:
        hints = [protocol.enable_hints[c] for c in from_protocol if c in protocol.enable_hints]
        from_settings = key == "attacks" and not set(from_protocol) & component.needs
        fix = (
            f"set {' '.join(hints)}"
            if hints
            else f"change attack.{name}.* (its settings ask for it)"
            if from_settings
            else f"remove {name} from {key}"
        )
        return f"{key}: {name} needs {_listed(from_protocol)}, which protocol.name={protocol.name} does not offer here; {fix}"
    if missing:
        return f"{key}: {name} needs {_listed(missing)}, which data.split={cfg.data.split} does not offer; {DATA_HINTS[missing[0]]}"
    fewest, why = component.min_clients if key == "attacks" else (1, "")
    if int(cfg.protocol.num_clients) < fewest:
        return (
            f"{key}: {name} needs at least {fewest} clients ({why}), and protocol.num_clients={cfg.protocol.num_clients}; "
            f"set protocol.num_clients={fewest} or more, or remove {name} from {key}"
        )
    return None


def _listed(capabilities: list[Capability]) -> str:
    return ", ".join(f"{CAPABILITY_TEXT[c]} ({c.value})" for c in capabilities)


def check_compatibility(cfg: DictConfig) -> None:
    """Every attack and defense gets what it declares it needs from the protocol and the data split as configured.

    Raises:
        ConfigError: ``attacks: pli needs a server model f_0 (server_model), which protocol.name=fedmd does not offer here; set
        protocol.server_model=true``
    """
    protocols, _, _ = registries()
    evasive_clients(cfg.protocol.evasive_clients, int(cfg.protocol.num_clients), protocols.get(cfg.protocol.name).uploads_outputs)
    _unique("attacks", list(cfg.attacks))
    _unique("defenses", list(cfg.defenses))
    for key in ("attacks", "defenses"):
        for name in cfg[key]:
            reason = unmet_needs(cfg, key, name)
            if reason:
                raise ConfigError(reason)


def check_sizes(cfg: DictConfig) -> None:
    """Sizes that cannot work and are known before the data: more clients than ``data.num_targets`` (split=pli).

    The sizes the data decides (the clients' pool against K x ``data.min_client_size``, the shards, the classes) are
    refused by :mod:`fdattack.data.partitions` as soon as the pool is cut, before any draw.

    Raises:
        ConfigError: ``protocol.num_clients=6 with data.partition=disjoint_identities needs at least 6 target labels ...``
    """
    if cfg.data.partition == "disjoint_identities" and cfg.data.num_targets is not None:
        partitions.require_identities(cfg.data.num_targets, int(cfg.protocol.num_clients))


def check_membership(cfg: DictConfig) -> None:
    """The membership attacks can score every client: each client's members are scored against label-matched
    non-members drawn from the test set (:mod:`fdattack.evaluation.membership`), so fewer than K + 1 candidates leave
    some client without a member or a non-member among them. (An empty test set, ``data.test_fraction=0`` where the
    dataset brings none of its own, is refused once the split is cut: :func:`fdattack.assembly.membership_candidates`.)

    Raises:
        ConfigError: ``evaluation.max_candidates=4 with attacks=[lira_coop]: ... so at least 5; ...``
    """
    from fdattack.attacks.results import MembershipScores

    _, attacks, _ = registries()
    membership = [name for name in cfg.attacks if MembershipScores in attacks.get(name).produces]
    if not membership:
        return
    k, most = int(cfg.protocol.num_clients), cfg.evaluation.max_candidates
    if most is not None and most < k + 1:
        raise ConfigError(
            f"evaluation.max_candidates={most} with attacks=[{','.join(membership)}]: each of the {k} clients needs one of its "
            f"members among the candidates and one non-member beside them, so at least {k + 1}; raise evaluation.max_candidates or "
            "leave it null (all)"
        )


def check_batch_norm(cfg: DictConfig) -> None:
    """``protocol.optim.batch_size=1`` is refused where a network it trains has BatchNorm: the clients', the server's, and
    the evaluation classifier of reconstructions (every mini-batch would be one row, which BatchNorm cannot train on;
    the engine drops a lone last row, :func:`~fdattack.engine.jobs.without_lone_row`, but here every row is one).

    Raises:
        ConfigError: ``protocol.optim.batch_size=1: model.name=mobilenet_v2 has BatchNorm, ...; use protocol.optim.batch_size >= 2``
    """
    if int(cfg.protocol.optim.batch_size) != 1:
        return
    from fdattack.attacks.results import Reconstructions

    protocols, attacks, _ = registries()
    m = cfg.model
    trained = [(f"model.clients[{i}]", name) for i, name in enumerate(m.clients)] or [("model.name", m.name)]
    if protocols.get(cfg.protocol.name).server_model_enabled(cfg.protocol):
        trained.append(("model.server", m.server) if m.server else ("model.name", m.name))
    if cfg.evaluation.classifier and any(Reconstructions in attacks.get(name).produces for name in cfg.attacks):
        trained.append(("evaluation.classifier", cfg.evaluation.classifier))
    with_bn = next(((key, name) for key, name in dict.fromkeys(trained) if _has_batch_norm(name)), None)
    if with_bn:
        raise ConfigError(
            f"protocol.optim.batch_size=1: {with_bn[0]}={with_bn[1]} has BatchNorm, which cannot train on mini-batches of one row; "
            "use protocol.optim.batch_size >= 2 or a network without BatchNorm"
        )


def _has_batch_norm(name: str) -> bool:
    """Whether classifier ``name`` holds BatchNorm, from a copy built on the meta device (no memory, no random draws) for
    3 x 64 x 64 images; a network that refuses that size is not judged here."""
    import torch

    from fdattack.engine.jobs import has_batch_norm
    from fdattack.models import build_classifier

    try:
        with torch.device("meta"):
            return has_batch_norm(build_classifier(name, 3, 64, 2))
    except ValueError:
        return False
