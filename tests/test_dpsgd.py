"""DP-SGD through opacus (pdafd.md §12, A26, A27): clipping by hand, plain training as its limit, ε against opacus'
own accountant, BatchNorm refused, every protocol's local training, resume."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from opacus.accountants import RDPAccountant
from torch import nn

from fdattack.cli import main
from fdattack.config import compose
from fdattack.data.imageset import ImageSet
from fdattack.defenses.dpsgd import DPSGDDefense, DPSGDSettings, poisson_batches
from fdattack.engine import FitJob, default_engine
from fdattack.errors import ConfigError
from fdattack.experiment import Experiment
from fdattack.lit.classifier import ClassifierLitModule, cross_entropy
from tests.conftest import error_of, tiny

QUIET = ("evaluation.confidence_gap.enabled=false", "evaluation.classifier=null")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "rounds.jsonl").read_text().splitlines()]


def _one_step(images: torch.Tensor, labels: torch.Tensor, settings: DPSGDSettings | None, seed: int = 0) -> torch.Tensor:
    """The change of a zero-initialised Linear(2, 2)'s (W, b), flattened, after one SGD step (lr 1) on one batch."""
    module = ClassifierLitModule(nn.Sequential(nn.Flatten(), nn.Linear(2, 2)), 2, optimizer="sgd", lr=1.0)
    nn.init.zeros_(module.net[1].weight)
    nn.init.zeros_(module.net[1].bias)
    engine = default_engine(batch_size=len(labels), vectorise=False)
    handle = engine.setup("client0", module)
    job = FitJob(handle, ImageSet.from_images(images, labels), 1, cross_entropy, seed=seed)
    if settings is not None:
        defense = DPSGDDefense(settings, seed=0)
        defense.wrap_network(0, module.net)
        job = defense.wrap_job(0, "local_train", job, len(labels))
    assert engine.fit(job).steps == 1
    return torch.cat([module.net[1].weight.detach().flatten(), module.net[1].bias.detach()])


def test_each_samples_gradient_is_clipped_to_c_before_averaging() -> None:
    # Zero weights: p = (1/2, 1/2), so sample (x, y) has gradient dz = p - e_y = ±(1/2, -1/2): dW = dz xᵀ, db = dz,
    # of norm sqrt(|x|²/2 + 1/2): 13^(1/2) for x = (3, 4) and 0.625^(1/2) for x = (0.3, 0.4).
    images = torch.tensor([[3.0, 4.0], [0.3, 0.4]]).view(2, 1, 1, 2)
    labels = torch.tensor([0, 1])

    def gradient(x: list[float], y: int) -> torch.Tensor:
        dz = torch.tensor([-0.5, 0.5]) if y == 0 else torch.tensor([0.5, -0.5])
        return torch.cat([torch.outer(dz, torch.tensor(x)).flatten(), dz])

    g1, g2 = gradient([3.0, 4.0], 0), gradient([0.3, 0.4], 1)
    assert float(g1.norm()) == pytest.approx(math.sqrt(13)) and float(g2.norm()) < 1
    dp = DPSGDSettings(noise_multiplier=0.0, max_grad_norm=1.0, poisson_sampling=False)
    step = _one_step(images, labels, dp)
    torch.testing.assert_close(step, -(g1 / math.sqrt(13) + g2) / 2, rtol=1e-5, atol=1e-6)  # only the large one is scaled down
    torch.testing.assert_close(_one_step(images, labels, None), -(g1 + g2) / 2)  # without the defense: the plain mean
    alone = _one_step(images[:1], labels[:1], dp)
    assert math.isclose(float(alone.norm()), 1.0, rel_tol=1e-5)  # one sample moves the model by at most lr * C / B


def test_noise_has_std_sigma_c_over_b_and_is_seeded_by_the_job() -> None:
    # Zero inputs give dW = 0, and the four clipped db = ±(1/2, -1/2) * C/|db| cancel: the step is the noise / B alone.
    images, labels = torch.zeros(4, 1, 1, 2), torch.tensor([0, 1, 0, 1])
    noisy = DPSGDSettings(noise_multiplier=2.0, max_grad_norm=0.5, poisson_sampling=False)
    assert torch.equal(_one_step(images, labels, noisy, seed=3), _one_step(images, labels, noisy, seed=3))
    steps = torch.cat([_one_step(images, labels, noisy, seed=s) for s in range(40)])
    assert float(steps.std()) == pytest.approx(2.0 * 0.5 / 4, rel=0.15)
    assert (
        torch.count_nonzero(_one_step(images, labels, DPSGDSettings(noise_multiplier=0.0, max_grad_norm=0.5, poisson_sampling=False))) == 0
    )


def test_poisson_batches_are_opacus_sampling_seeded_per_epoch() -> None:
    batches = [b.tolist() for b in poisson_batches(100, 7, 10)]
    assert len(batches) == 10 and batches == [b.tolist() for b in poisson_batches(100, 7, 10)]  # int(1/q) steps, seeded
    assert len({len(b) for b in batches}) > 1  # sizes vary around B
    sizes = [len(b) for seed in range(200) for b in poisson_batches(100, seed, 10)]
    assert abs(sum(sizes) / len(sizes) - 10) < 0.5
    assert any(len(b) == 0 for seed in range(200) for b in poisson_batches(20, seed, 1))  # empty steps happen (q = 1/20, 20 steps)


def test_an_empty_poisson_step_still_takes_a_noisy_step_and_leaves_the_loss_finite() -> None:
    module = ClassifierLitModule(nn.Sequential(nn.Flatten(), nn.Linear(2, 2)), 2, optimizer="sgd", lr=1.0)
    before = [p.detach().clone() for p in module.parameters()]
    engine = default_engine(batch_size=2, vectorise=False)
    defense = DPSGDDefense(DPSGDSettings(noise_multiplier=1.0, max_grad_norm=1.0), seed=0)
    defense.wrap_network(0, module.net)
    data = ImageSet.from_images(torch.ones(4, 1, 1, 2), torch.tensor([0, 1, 0, 1]))
    job = defense.wrap_job(0, "local_train", FitJob(engine.setup("client0", module), data, 1, cross_entropy, seed=0), 2)
    result = engine.fit(replace(job, sampler=lambda n, seed, size: [torch.tensor([], dtype=torch.long)]))
    assert result.steps == 1 and math.isnan(result.mean_loss)  # no sample, no loss; the step itself was taken
    assert all(not torch.equal(p, b) for p, b in zip(module.parameters(), before))  # noise only
    result = engine.fit(replace(job, sampler=lambda n, seed, size: [torch.tensor([], dtype=torch.long), torch.tensor([0, 1])]))
    assert result.steps == 2 and math.isfinite(result.mean_loss)  # the empty step does not make the phase's loss NaN
    assert defense.accountants[0].history == [(1.0, 0.5, 3)]


def test_without_noise_clipping_or_poisson_sampling_training_is_unchanged(tmp_path: Path) -> None:
    # One batch holds a whole private set, so the DP step's sum over B = n samples is the plain mean gradient.
    common = ("protocol.name=dsfl", "protocol.rounds=1", "protocol.optim.batch_size=1000", "trainer.vectorise=false", *QUIET)
    plain = Experiment(compose(None, tiny(tmp_path / "plain", *common)))
    plain.run()
    dp = Experiment(
        compose(
            None,
            tiny(
                tmp_path / "dp",
                *common,
                "defenses=[dpsgd]",
                "defense.dpsgd.noise_multiplier=0",
                "defense.dpsgd.max_grad_norm=1e9",
                "defense.dpsgd.poisson_sampling=false",
            ),
        )
    )
    dp.run()
    for a, b in zip(plain.protocol.clients, dp.protocol.clients, strict=True):
        assert a.module.state_dict().keys() == b.module.state_dict().keys()
        for name, tensor in a.module.state_dict().items():
            torch.testing.assert_close(b.module.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    assert _rows(tmp_path / "dp" / "run")[-1]["defense/dpsgd/epsilon"] is None  # σ = 0: ε = inf, written as null


def test_epsilon_is_opacus_rdp_over_the_private_steps_and_grows(tmp_path: Path) -> None:
    sigma, batch, delta = 1.3, 8, 1e-4
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                "protocol.name=dsfl",
                "protocol.rounds=2",
                "protocol.private_epochs=2",
                "protocol.distill_epochs=1",
                f"protocol.optim.batch_size={batch}",
                "defenses=[dpsgd]",
                f"defense.dpsgd.noise_multiplier={sigma}",
                f"defense.dpsgd.delta={delta}",
                *QUIET,
            ),
        )
    )
    exp.run()
    rows = _rows(tmp_path / "run")
    assert rows[0]["defense/dpsgd/epsilon"] == 0.0  # DS-FL without warm-up: no private step before round 1
    for round in (1, 2):
        expected = []
        for private in exp.data.split.private:  # only local_train is private (2 epochs of int(1/q) Poisson steps); distill is not
            q = min(1.0, batch / len(private))
            accountant = RDPAccountant()
            accountant.history = [(sigma, q, round * 2 * int(1 / q))]
            expected.append(accountant.get_epsilon(delta=delta))
        assert rows[round]["defense/dpsgd/epsilon"] == pytest.approx(max(expected), rel=1e-12)
        assert rows[round]["defense/dpsgd/epsilon_mean"] == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    assert 0 < rows[1]["defense/dpsgd/epsilon"] < rows[2]["defense/dpsgd/epsilon"]


@pytest.mark.parametrize(
    ("key", "named"),
    [("model.name=vgg16_bn", "model.name=vgg16_bn"), ("model.clients=[pdafd_cnn,fedinverse_cnn]", "model.clients[1]=fedinverse_cnn")],
)
def test_batchnorm_network_is_refused_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, named: str) -> None:
    assert main(["run", *tiny(tmp_path, "protocol.name=dsfl", "defenses=[dpsgd]", key)]) == 2
    err = capsys.readouterr().err.strip()
    err = error_of(err)
    assert f"defense dpsgd: {named} has BatchNorm2d" in err and "resnet18_gn" in err and "vgg16_bn, " not in err
    assert not (tmp_path / "run" / "rounds.jsonl").exists()


def test_ddp_is_refused_at_build_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    with pytest.raises(ConfigError, match=r"trainer.devices=1"):
        DPSGDDefense(DPSGDSettings(), seed=0).wrap_network(0, nn.Linear(2, 2))


@pytest.mark.parametrize(
    "protocol",
    [
        ("protocol.name=fedmd", "protocol.transfer_public_epochs=1", "protocol.transfer_private_epochs=1", "protocol.digest_epochs=1"),
        ("protocol.name=dsfl", "protocol.warmup_private_epochs=1", "protocol.private_epochs=1", "protocol.distill_epochs=1"),
        ("protocol.name=cronus", "protocol.private_epochs=1", "protocol.kd_epochs=1"),
        ("protocol.name=fedavg",),
    ],
    ids=["fedmd", "dsfl", "cronus", "fedavg"],
)
def test_every_protocol_trains_its_local_phases_with_dpsgd(tmp_path: Path, protocol: tuple[str, ...]) -> None:
    exp = Experiment(compose(None, tiny(tmp_path, *protocol, "protocol.rounds=1", "defenses=[dpsgd]", *QUIET)))
    exp.run()
    assert _rows(tmp_path / "run")[-1]["defense/dpsgd/epsilon"] > 0
    for handle in exp.protocol.clients:  # between private phases the network is the plain one again
        net = handle.module.net
        assert not any(m._forward_hooks or m._backward_hooks for m in net.modules())
        assert not any(hasattr(p, "grad_sample") or hasattr(p, "summed_grad") for p in net.parameters())
        assert all(name.startswith("net.") and "_module" not in name for name in handle.module.state_dict())


def test_resume_after_a_private_round_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "run",
        *tiny(
            tmp_path,
            "protocol.name=dsfl",
            "protocol.rounds=3",
            "protocol.private_epochs=1",
            "protocol.distill_epochs=1",
            "protocol.optim.batch_size=8",
            "defenses=[dpsgd]",
            *QUIET,
        ),
    ]
    assert main(args) == 0
    finished, rows = json.loads((out / "metrics.json").read_text()), _rows(out)
    (out / "checkpoints" / "round_0003.pt").unlink()
    assert main([*args, "resume=true"]) == 0

    def without_times(d: dict) -> dict:
        return {k: v for k, v in d.items() if not k.startswith("time/")}

    assert without_times(json.loads((out / "metrics.json").read_text())) == without_times(finished)
    assert [without_times(r) for r in _rows(out)] == [without_times(r) for r in rows]
    assert finished["defense/dpsgd/epsilon"] > rows[2]["defense/dpsgd/epsilon"] > 0  # the accountants came back from round 2
