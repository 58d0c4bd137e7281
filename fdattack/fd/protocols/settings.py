"""The keys every protocol has (:class:`ProtocolSettings`, which each protocol's own settings extend) and the
optimizer of its local phases (``protocol.*``, ``protocol.optim.*``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from fdattack.knobs import Choice, knob


class OptimizerName(Choice):
    adam = "adam"
    sgd = "sgd"


@dataclass
class OptimSettings:
    name: OptimizerName = knob(OptimizerName.adam, "optimizer of every local phase")
    lr: float = knob(1e-3, "learning rate", gt=0)
    weight_decay: float = knob(0.0, "L2 weight decay", ge=0)
    momentum: float = knob(0.0, "sgd momentum", ge=0, lt=1)
    nesterov: bool = knob(False, "sgd Nesterov momentum")
    batch_size: int = knob(64, "mini-batch size for every local phase", ge=1)
    fresh_per_phase: bool = knob(False, "build a new optimizer at every phase instead of keeping one per model")


class OnBadUpload(Choice):
    error = "error"
    drop = "drop"


@dataclass
class ProtocolSettings:
    """Keys every protocol has; each protocol's own dataclass (in ``fd/protocols/``) extends it."""

    name: str = knob("fedmd", "protocol registry name: fedmd | fedgems | dsfl | cronus | fedavg | labelavg")
    num_clients: int = knob(4, "K, the number of clients", ge=1)
    rounds: int = knob(5, "communication rounds T", ge=1)
    public_per_round: Optional[int] = knob(None, "public samples drawn per round; null = all of the public set", ge=1)
    public_stratified: bool = knob(
        False,
        "draw the round's public samples evenly over the labels (PDA-FD's class-balanced D_inf) where the public set is labeled; else "
        "uniformly",
    )
    on_bad_upload: OnBadUpload = knob(
        OnBadUpload.error,
        "what a NaN/inf upload does: error (stop with a message) | drop (leave that client out of the round and record it)",
    )
    evasive_clients: Any = knob(
        "none",
        "clients that refuse to return outputs on public or queried samples of their own training set, and withhold as many seeded decoys "
        "(Shi et al., PoPETs 2025, §5.5): none | all | a list of client indices",
    )
    evasion_decoys: float = knob(
        1.0,
        "decoys an evasive client withholds per own sample of a request, drawn by a seeded key among the request's other samples; "
        "the server, knowing the rule, reads a withheld row as a member with odds 1 : evasion_decoys; inf withholds every row of a "
        "request that holds one of its samples (the only rate that hides which)",
        ge=0,
        finite=False,
    )
    optim: OptimSettings = knob(OptimSettings(), "optimizer of clients and server")
