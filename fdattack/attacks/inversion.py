"""What PLI and TBI share: inversion networks kept per key (client) in a store, seeded and resumable."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.attacks.base import Attack, AttackContext
from fdattack.attacks.common import engine_or_default
from fdattack.attacks.pli_inputs import tempered_softmax
from fdattack.attacks.results import Reconstructions
from fdattack.engine import ModelHandle
from fdattack.errors import ConfigError
from fdattack.fd.record import PublicQuery
from fdattack.fd.threat import AttackerView, Capability, ViewPart
from fdattack.knobs import knob
from fdattack.lit.inversion import InversionLitModule
from fdattack.models.inversion import InversionDecoder


@dataclass
class InversionSettings:
    """Knobs of the inversion networks (Takahashi et al., CVPR 2023, App. C): temperature of their inputs, Adam, batches, epochs, width."""

    tau: float = knob(3.0, "softmax temperature of the inversion inputs", gt=0)
    lr: float = knob(3e-5, "inversion-network Adam learning rate", gt=0)
    weight_decay: float = knob(1e-4, "inversion-network Adam weight decay", ge=0)
    batch_size: int = knob(8, "inversion-network batch size", ge=1)
    epochs_per_round: int = knob(3, "inversion epochs per communication round", ge=0)
    max_width: int = knob(1024, "widest inversion-network feature map (1024 in the paper)", ge=8)


class InversionAttack(Attack):
    """Base of the inversion attacks: one :class:`InversionLitModule` per key, restored from ``store`` each round.

    The context's store keeps the networks between rounds; its seed seeds their initialisation and shuffling;
    its engine trains them (``trainer.accelerator``/``precision``, sharded under DDP).
    """

    needs = frozenset({Capability.public_data, Capability.public_outputs, Capability.private_targets})
    reads = frozenset({ViewPart.public})
    produces = frozenset({Reconstructions})

    def __init__(self, view: AttackerView, settings: InversionSettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        if view.public is None:
            raise ConfigError(f"attacks: {self.name} inverts outputs on public data, and protocol {view.protocol} has none; set attacks=[]")
        self.settings: InversionSettings = settings
        self.seed = context.seed
        self.progress = context.progress
        self.store = context.store
        self.engine = engine_or_default(context, settings.batch_size)
        self.targets = torch.as_tensor(view.target_labels, dtype=torch.long)
        self.num_classes = view.num_classes

    def _input_features(self) -> int:
        """Size of the inversion network's input."""
        return self.num_classes

    def _module(self) -> InversionLitModule:
        c, _, s = self.view.image_shape
        decoder = InversionDecoder(self._input_features(), c, s, self.settings.max_width)
        return InversionLitModule(decoder, self.settings.lr, self.settings.weight_decay, self._gamma())

    def _gamma(self) -> float:
        return 0.0

    def _restored(self, key: int) -> ModelHandle:
        """The network of ``key`` as the last finished round left it (freshly initialised before its first round), set up
        on the engine."""
        with torch.random.fork_rng(devices=[]):  # a passive attack leaves the run's random stream alone
            torch.manual_seed(self.seed + 7919 * key)
            module = self._module()
        handle = self.engine.setup(f"{self.name}_{key}", module)
        state = self.store.get(key)
        if state is not None:
            handle.load_state_dict(state)
        return handle

    def _stored(self, round: int, key: int, handle: ModelHandle) -> None:
        """Put the network of ``key`` in the store for ``round`` and let the engine forget it."""
        self.store.put(round, key, handle.state_dict())
        self.engine.release(handle)

    def _tempered(self, query: PublicQuery, model: int | str, rows: Tensor) -> Tensor:
        """softmax(output / tau) of ``model`` on public ``rows``, from what the query answers (logits or probs)."""
        outputs = query(model, rows)
        kind, temperature = ("logits", 1.0) if model == "server" else (query.kind, query.temperature)
        return tempered_softmax(outputs, kind, temperature, self.settings.tau)

    def state_dict(self) -> dict:
        return {"store": self.store.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "store" in state:
            self.store.load_state_dict(state["store"])
