"""VMI's Glow-style flow and its miner (fedinverse.md §4.3, §5, §9 A12): exactness of the flow, the loss terms, and
that the miner learns under a plain ``lightning.Trainer``."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor, nn

from fdattack.functional.hsic import HSICOptions, dependence, split_halves
from fdattack.lit import VMIMinerLitModule
from fdattack.models import Glow
from fdattack.models.flows import ActNorm, standard_normal_log_prob

THRESHOLD = math.tanh(1.0)  # pixel 0 = tanh(z_0 / 2) exceeds it iff z_0 > 2: 2.3% of the prior's samples


class TinyGenerator(nn.Module):
    """(N, 4) latents -> (N, 1, 2, 2) images tanh(BN(z) / 2) in (−1, 1); the BatchNorm must stay in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(4)

    def forward(self, z: Tensor) -> Tensor:
        return torch.tanh(self.norm(z) / 2).view(-1, 1, 2, 2)


def tiny_target() -> nn.Module:
    """Two classes: class 1 iff pixel 0 > tanh(1), sharply (logit gap 20 · (pixel 0 − tanh 1))."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    with torch.no_grad():
        net[1].weight.zero_()
        net[1].bias.zero_()
        net[1].weight[1, 0] = 20.0
        net[1].bias[1] = -20.0 * THRESHOLD
    return net


def miner(**kwargs: object) -> VMIMinerLitModule:
    options: dict[str, object] = dict(label=1, latent_dim=4, steps_per_level=2, levels=2, hidden=16, batch_size=32, patience=None)
    return VMIMinerLitModule(TinyGenerator(), tiny_target(), **{**options, **kwargs})  # type: ignore[arg-type]


def trainer(tmp_path: Path, **kwargs: object) -> L.Trainer:
    options = dict(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    return L.Trainer(**{**options, **kwargs})  # type: ignore[arg-type]


def randomised(flow: Glow, z: Tensor) -> Glow:
    """``flow`` initialised on z, then every parameter perturbed: couplings no longer zero, ActNorm scales ≠ 1."""
    flow.initialize(z)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return flow


def test_flow_round_trip_is_exact_in_float64() -> None:
    torch.manual_seed(0)
    z = torch.randn(64, 12, dtype=torch.float64)
    flow = randomised(Glow(12, steps_per_level=3, levels=3, hidden=16), z)  # 12, 6 and 3 coordinates
    assert all(p.dtype == torch.float64 for p in flow.parameters())
    eps, logdet = flow.encode(z)
    back, logdet_back = flow.decode(eps)
    assert eps.dtype == torch.float64 and not torch.allclose(eps, z, atol=0.1)  # a non-trivial map
    assert (back - z).abs().max() < 1e-6
    assert (logdet + logdet_back).abs().max() < 1e-6
    noise = torch.randn(64, 12, dtype=torch.float64)
    assert (flow.encode(flow.decode(noise)[0])[0] - noise).abs().max() < 1e-6


def test_log_determinant_matches_the_autograd_jacobian() -> None:
    torch.manual_seed(1)
    flow = randomised(Glow(6, steps_per_level=2, levels=2, hidden=8), torch.randn(32, 6, dtype=torch.float64))
    z = torch.randn(6, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda v: flow.encode(v[None])[0][0], z)
    _, logabsdet = torch.linalg.slogdet(jac)
    eps, logdet = flow.encode(z[None])
    assert abs(logabsdet.item()) > 0.1 and logdet.item() == pytest.approx(logabsdet.item(), abs=1e-9)
    jac_decode = torch.autograd.functional.jacobian(lambda v: flow.decode(v[None])[0][0], eps[0])
    assert flow.decode(eps)[1].item() == pytest.approx(torch.linalg.slogdet(jac_decode)[1].item(), abs=1e-9)
    expected = standard_normal_log_prob(eps).item() + logabsdet.item()
    assert flow.log_prob(z[None]).item() == pytest.approx(expected, abs=1e-9)


def test_identity_flow_has_the_base_density() -> None:
    torch.manual_seed(2)
    z = 3 * torch.randn(16, 5, dtype=torch.float64)
    base = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(-1)
    plain = Glow(5, steps_per_level=2, levels=2, hidden=8, actnorm=False)  # zero couplings: a permutation of z
    assert torch.allclose(plain.log_prob(z), base, atol=1e-12)
    flow = Glow(5, steps_per_level=2, levels=2, hidden=8)
    flow.initialize(torch.randn(50, 5))
    assert not torch.allclose(flow.log_prob(z), base, atol=1e-3)  # ActNorm fitted to a batch moves the density
    with torch.no_grad():
        for module in flow.modules():
            if isinstance(module, ActNorm):
                module.bias.zero_()
                module.log_scale.zero_()
    assert torch.allclose(flow.log_prob(z), base, atol=1e-12)
    samples, log_q = flow.sample(8)
    assert torch.allclose(log_q, standard_normal_log_prob(samples), atol=1e-12)


def test_actnorm_initialisation_standardises_its_first_batch_only() -> None:
    torch.manual_seed(3)
    mean, std = torch.tensor([3.0, -1.0, 0.5, 10.0], dtype=torch.float64), torch.tensor([2.0, 0.1, 1.0, 5.0])
    x = mean + std * torch.randn(400, 4)
    norm = ActNorm(4).double()
    y, logdet = norm.encode(x)
    assert y.mean(0).abs().max() < 1e-9 and (y.std(0, unbiased=False) - 1).abs().max() < 1e-4
    assert logdet[0].item() == pytest.approx(-torch.log(x.std(0, unbiased=False)).sum().item(), abs=1e-4)
    y2, _ = norm.encode(x + 7)  # already initialised: the same affine map, shifted outputs
    assert torch.allclose(y2, y + 7 * norm.log_scale.exp(), atol=1e-9)
    flow = Glow(4, steps_per_level=2, levels=1, hidden=8)
    with pytest.raises(RuntimeError, match="initialize"):
        flow.sample(2)
    flow.initialize(x)
    first = flow.steps[0].layers[0]
    out, _ = first.encode(x)
    assert out.mean(0).abs().max() < 1e-9 and (out.std(0, unbiased=False) - 1).abs().max() < 1e-4


def test_kl_term_is_zero_at_the_prior_and_matches_the_gaussian_kl_otherwise() -> None:
    torch.manual_seed(4)
    m = miner(num_layers=2, steps_per_level=1, levels=1)
    with torch.no_grad():
        for module in m.flows.modules():
            if isinstance(module, ActNorm):
                module.bias.zero_()
                module.log_scale.zero_()
    assert abs(m.kl_divergence(64).item()) < 1e-12  # q_l = N(0, I) for both layers
    s, b = 0.3, 0.5  # layer 1: z = P⁻¹ε e^(−s) − b, i.e. N(−b, e^(−2s)) per coordinate
    with torch.no_grad():
        norm = m.flows[1].steps[0].layers[0]
        norm.log_scale.fill_(s)
        norm.bias.fill_(b)
    per_coordinate = 0.5 * (math.exp(-2 * s) + b**2 - 1) + s
    expected = (0 + 4 * per_coordinate) / 2  # (1/L) Σ_l over the two layers
    assert m.kl_divergence(20000).item() == pytest.approx(expected, abs=0.03)


@pytest.mark.parametrize("sign", [1, -1])
def test_hsic_term_is_signed_weighted_and_on_unit_range_images(sign: int) -> None:
    options = HSICOptions(estimator="biased_eq3", sigma=1.0, sigma_scale_by_dim=False)
    m = miner(batch_size=8, lambda_h=0.5, hsic_sign=sign, hsic_options=options, lr=0.05, lambda_attack=0.0, lambda_kl=0.0, seed=5)
    with torch.no_grad():  # a spread-out miner, so that the batch's dependence is not ~0
        for module in m.flows.modules():
            if isinstance(module, ActNorm):
                module.log_scale.fill_(-1.0)
    torch.manual_seed(10)
    terms = m.objective()
    torch.manual_seed(10)
    x = m.sample(8)
    on_unit = dependence(*split_halves((x + 1) / 2), options)
    assert terms["hsic"].item() == pytest.approx(sign * 0.5 * on_unit.item(), rel=1e-5)
    assert abs(on_unit.item() - dependence(*split_halves(x), options).item()) > 1e-3  # the range matters here
    assert terms["loss"].item() == pytest.approx(terms["hsic"].item(), rel=1e-6)  # λ_attack = γ = 0
    # one small SGD step moves the dependence of the same batch down for sign +1 (the code) and up for −1
    optimizer = m.configure_optimizers()
    optimizer.zero_grad()
    terms["loss"].backward()
    optimizer.step()
    torch.manual_seed(10)
    after = m.objective()["hsic"].item()
    assert after < terms["hsic"].item()  # the term is minimised either way ...
    dependence_before, dependence_after = (v / (sign * 0.5) for v in (terms["hsic"].item(), after))
    assert sign * (dependence_after - dependence_before) < -1e-5 * dependence_before  # ... moving the measure ∓


def test_miner_learns_the_label_under_a_plain_trainer(tmp_path: Path) -> None:
    torch.manual_seed(6)
    m = miner(lr=0.01, seed=6)
    generator_state = {k: v.clone() for k, v in m.generator.state_dict().items()}
    target_state = {k: v.clone() for k, v in m.target.state_dict().items()}
    before = m.target_accuracy(m.sample(500))
    ce_before = torch.stack([m.objective()["ce"] for _ in range(5)]).mean()
    t = trainer(tmp_path, max_epochs=4)  # 40 steps of 32 samples
    t.fit(m)
    after = m.target_accuracy(m.sample(500))
    ce_after = torch.stack([m.objective()["ce"] for _ in range(5)]).mean()
    assert before < 0.1 and after > 0.9  # chance is 0.5
    assert ce_after < 0.2 * ce_before
    assert t.global_step == 40 and "vmi/ce" in t.callback_metrics and "vmi/selection_score" in t.callback_metrics
    assert all(p.dtype == torch.float64 for p in m.flows.parameters())
    m.train()  # what fdattack's engine calls before its steps
    m.objective()
    assert m.flows.training and not m.generator.training and not m.target.training  # frozen nets: eval mode ...
    for k, v in m.generator.state_dict().items():  # ... so BatchNorm's running statistics did not move
        assert torch.equal(v, generator_state[k]), k
    for k, v in m.target.state_dict().items():
        assert torch.equal(v, target_state[k]), k
    assert len(m.history) == 4 and m.best_score == max(m.history) and m.history[m.best_epoch - 1] == m.best_score


def test_selection_defaults_to_the_target_and_restores_the_best_epoch(tmp_path: Path) -> None:
    torch.manual_seed(7)
    m = miner(lr=0.01, eval_samples=50)
    torch.manual_seed(11)
    m.end_epoch()
    torch.manual_seed(11)
    assert m.history == [m.target_accuracy(m.sample(50))]  # leak-free default: the target's accuracy

    snapshots: list[dict[str, Tensor]] = []

    def falling(images: Tensor) -> float:  # an explicit scorer: best at its first call, worse after
        snapshots.append({k: v.clone() for k, v in m.flows.state_dict().items()})
        return -float(len(snapshots))

    m = miner(lr=0.01, scorer=falling, patience=2)
    t = trainer(tmp_path, max_epochs=10)
    t.fit(m)
    assert m.history == [-1.0, -2.0, -3.0] and t.current_epoch == 3  # patience 2 stopped it after epoch 3
    assert m.best_epoch == 1
    last = {k: v.clone() for k, v in m.flows.state_dict().items()}
    m.restore_best()
    restored = m.flows.state_dict()
    assert any(not torch.equal(restored[k], last[k]) for k in last)
    assert all(torch.equal(restored[k], snapshots[0][k]) for k in restored)
