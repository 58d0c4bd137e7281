"""The Fabric engine drives any LightningModule's own training_step: automatic and manual optimisation, exactly."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from fdattack.engine import LocalTrainer, TensorRows, default_engine
from fdattack.lit import InversionLitModule, RestorerLitModule
from fdattack.models import InversionDecoder
from fdattack.randomness import derive_seed, seed_everything_quietly


def _rows(n: int = 20) -> TensorRows:
    g = torch.Generator().manual_seed(0)
    return TensorRows(
        input=torch.softmax(torch.randn(n, 6, generator=g), -1),
        x=torch.rand(n, 1, 8, 8, generator=g) * 2 - 1,
        prior=torch.zeros(n, 1, 8, 8),
    )


def test_automatic_optimisation_equals_a_hand_loop_bit_for_bit() -> None:
    torch.manual_seed(0)
    module = InversionLitModule(InversionDecoder(6, 1, 8, 32), lr=1e-3, weight_decay=1e-4, gamma=0.3)
    by_hand = copy.deepcopy(module)
    rows = _rows()
    engine = default_engine()
    handle = engine.setup("inversion", module)
    result = engine.fit_module(handle, rows, epochs=2, seed=7, batch_size=6)
    optimizer = by_hand.configure_optimizers()
    for epoch in range(2):
        for idx in torch.split(torch.randperm(20, generator=torch.Generator().manual_seed(derive_seed(7, epoch))), 6):
            loss = by_hand.loss(rows.batch(idx))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    assert result.steps == 2 * 4
    for (name, a), b in zip(module.state_dict().items(), by_hand.state_dict().values()):
        assert torch.equal(a, b), name


def test_manual_optimisation_runs_the_modules_own_steps() -> None:
    """The restorer's training_step steps its generator and discriminator optimizers itself (self.optimizers())."""
    torch.manual_seed(0)
    module = RestorerLitModule(1, 8, width=8, lr=1e-3, adversarial_weight=0.01)
    by_hand, initial = copy.deepcopy(module), copy.deepcopy(module)
    g = torch.Generator().manual_seed(1)
    clean = torch.rand(12, 1, 8, 8, generator=g) * 2 - 1
    pairs = TensorRows(a=clean * 0.5, b=clean)
    engine = default_engine()
    handle = engine.setup("translator", module)
    assert len(handle.optimizers) == 2 and not module.automatic_optimization
    engine.fit_module(handle, pairs, epochs=1, seed=3, batch_size=4, shuffle=False)
    by_hand.manual_backward = lambda loss: loss.backward()  # type: ignore[method-assign]  # no Trainer, no Fabric
    g_opt, d_opt = by_hand.configure_optimizers()
    for idx in torch.split(torch.arange(12), 4):
        by_hand.optimization_step(pairs.batch(idx), g_opt, d_opt)
    for (name, a), b in zip(module.state_dict().items(), by_hand.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(module.generator.parameters(), initial.generator.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(module.disc.parameters(), initial.disc.parameters()))


def test_released_modules_are_not_kept_by_fabric() -> None:
    engine = default_engine()
    for _ in range(3):
        handle = engine.setup("round", InversionLitModule(InversionDecoder(6, 1, 8, 16)))
        engine.fit_module(handle, _rows(4), epochs=1, seed=0, batch_size=4)
        engine.release(handle)
    assert not [c for c in engine.fabric._callbacks if isinstance(c, InversionLitModule)]


@pytest.mark.parametrize("n", [41, 40, 39, 21, 3])
def test_ddp_shards_take_equal_steps_and_never_a_lone_batch_norm_row(n: int) -> None:
    """Padded to equal shards first, then the lone row dropped per shard: ranks never wait on each other's extra step.
    (The drop used to come first, and the padding counted the rows before it: 41 rows, B = 10 on 2 ranks gave rank 0
    three steps, the last of one row, and rank 1 two.)"""
    shards = []
    for rank in (0, 1):
        engine = LocalTrainer(SimpleNamespace(world_size=2, global_rank=rank), batch_size=10)  # type: ignore[arg-type]
        shards.append(engine._batches(n, seed=3, batch_size=10, lone_row=False))
    assert len(shards[0]) == len(shards[1])
    assert all(len(batch) > 1 for shard in shards for batch in shard)
    seen = torch.cat([batch for shard in shards for batch in shard])
    assert len(set(seen.tolist())) >= n - 2  # every row but at most one per rank's lone batch


def test_seeding_puts_a_derived_seed_in_the_global_generators_never_the_run_seed() -> None:
    """No global generator may hand an attack the run seed (issue 47): torch's, NumPy's and Python's are seeded from
    ``derive_seed(42, "globals")``, and seeding again draws the same streams."""
    import random

    import numpy as np

    seed_everything_quietly(42)
    drawn = (torch.rand(5), np.random.rand(3), random.random())
    assert torch.initial_seed() == derive_seed(42, "globals") != 42
    torch.manual_seed(42)
    assert not torch.equal(drawn[0], torch.rand(5))
    assert not np.array_equal(drawn[1], np.random.RandomState(42).rand(3)) and drawn[2] != random.Random(42).random()
    seed_everything_quietly(42)
    assert torch.equal(drawn[0], torch.rand(5)) and np.array_equal(drawn[1], np.random.rand(3)) and drawn[2] == random.random()
