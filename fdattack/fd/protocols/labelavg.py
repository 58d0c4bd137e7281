"""LabelAvg (Xiao et al., DSN 2024, §V): FedMD whose clients upload top-K labels and the server smooths them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Sequence

import torch
from omegaconf import DictConfig

from fdattack.data.federated import FederatedSplit
from fdattack.defenses.base import Defense
from fdattack.defenses.labelavg import LabelAvgUpload, LabelAvgUploadSettings
from fdattack.engine import LocalTrainer
from fdattack.errors import ConfigError
from fdattack.fd.protocols.base import PROTOCOLS
from fdattack.fd.protocols.fedmd import FedMDProtocol, FedMDSettings
from fdattack.fd.threat import ServerAggregation, ThreatModel
from fdattack.functional.label_avg import smooth_labels
from fdattack.knobs import Choice, knob
from fdattack.lit.classifier import Objective
from fdattack.lit.objectives import soft_cross_entropy
from fdattack.vocabulary import SERVER_POWERS, PayloadKind


def vote_smoothing(
    uploads: torch.Tensor, labels: torch.Tensor, *, k: int, mix_alpha: float, ground_truth: bool, renorm: bool
) -> torch.Tensor:
    """LabelAvg's server rule (Eqs. 11-12): :func:`~fdattack.functional.label_avg.smooth_labels` of the uploads, v_main the
    public label where ``ground_truth`` (vmain=gt) and the row has one, else the max vote."""
    return smooth_labels(uploads, k, mix_alpha, labels if ground_truth else None, renorm)


class LabelWeightsChoice(Choice):
    beta = "beta"
    ones = "ones"


class VMain(Choice):
    gt = "gt"
    vote = "vote"


@dataclass
class LabelAvgSettings(FedMDSettings):
    name: str = "labelavg"
    top_k: int = knob(
        3,
        "K, labels (with weights) each client uploads per public sample; the paper uses 3-5 (Table IV: 4 on FEMNIST, "
        "3 on CIFAR-100, 5 on CIFAR-10), 3 sends 2K = 6 numbers against FedMD's 10 logits on 10 classes",
        ge=1,
    )
    mix_alpha: float = knob(
        0.5, "α of Eq. 12: (1 - α) v_main + α v_smooth (0 = hard labels, 1 = the votes alone; not given in the paper)", ge=0, le=1
    )
    label_weights: LabelWeightsChoice = knob(
        LabelWeightsChoice.beta, "weights of the uploaded labels: beta (Eq. 10, p / p_max) | ones (plain votes)"
    )
    vmain: VMain = knob(
        VMain.gt, "v_main of Eq. 12: gt (the public label where the row is labeled, else the max vote) | vote (always the max vote)"
    )
    renorm_smooth: bool = knob(False, "renormalise v_smooth (Eq. 11) to sum 1 before Eq. 12")
    digest_epochs: int = knob(
        1, "per round: epochs of soft cross-entropy to v_smooth on the public set (Eq. 13; skipped with one client)", ge=0
    )
    server_model: bool = knob(False, "train an attacker-added server model f_0 on the labeled public set (LabelAvg itself has none)")


@PROTOCOLS.register("labelavg")
class LabelAvgProtocol(FedMDProtocol):
    """FedMD's transfer, then per round: upload top-K labels and weights, smooth them by votes (Eqs. 11-12), digest
    (soft cross-entropy to v_smooth, Eq. 13), revisit (CE on private).

    The client side is :class:`~fdattack.defenses.labelavg.LabelAvgUpload`, the first upload defense, so the round's
    uploads and every query answer are w_P ⊙ v_P (K nonzero entries per row, top weight 1).
    """

    name = "labelavg"
    Settings = LabelAvgSettings
    digest_objective: ClassVar[Objective] = staticmethod(soft_cross_entropy)
    threat_model = ThreatModel(
        attacker="server, honest-but-curious",
        sees="top-K labels and their weights of every client on every public sample of the round",
        public_labels_known=True,
        query_rows="public",
        adversary=SERVER_POWERS,
    )

    def __init__(
        self,
        cfg: DictConfig,
        model_cfg: DictConfig,
        split: FederatedSplit,
        engine: LocalTrainer,
        seed: int,
        defenses: Sequence[Defense] = (),
    ) -> None:
        if cfg.top_k > split.num_classes:
            raise ConfigError(
                f"protocol.top_k={cfg.top_k} is more than the data's {split.num_classes} classes; allowed: 1 to {split.num_classes}"
            )
        super().__init__(cfg, model_cfg, split, engine, seed, defenses)
        client_side = LabelAvgUpload(LabelAvgUploadSettings(int(cfg.top_k), str(cfg.label_weights)), seed)  # type: ignore[arg-type]
        self.upload_defenses = (client_side, *self.upload_defenses)

    def upload_kind(self) -> tuple[PayloadKind, float]:
        return "probs", 1.0

    def aggregation(self) -> ServerAggregation:
        """Vote smoothing with this run's K, α, v_main and renormalisation (:func:`vote_smoothing`)."""
        cfg = self.cfg
        return ServerAggregation(
            partial(
                vote_smoothing,
                k=int(cfg.top_k),
                mix_alpha=float(cfg.mix_alpha),
                ground_truth=cfg.vmain == "gt",
                renorm=bool(cfg.renorm_smooth),
            ),
            "probs",
        )
