"""DP-SGD on the vectorised path (:mod:`fdattack.engine.vectorised.private`) against opacus' per-client loop.

Every test asserts which path trained (the ``private_calls`` spy), so none passes where DP-SGD jobs fall back to the
loop unseen. Tolerances. Without noise, one step on the same batch equals opacus' to float rounding
(per-sample gradients from vmapped im2col products against opacus' hooks: rtol = 1e-5, atol = 1e-6). Both paths
draw the same Poisson batches and the same noise from the job's seeds, so whole phases agree too, to the rounding
that the steps accumulate (rtol = atol = 1e-5 after a few dozen steps, as in ``tests/test_vectorised.py``). The
noise's std is tested on 360 draws per client: the sample std's relative standard error is 1/sqrt(2·360) = 3.7%,
so the tolerance is 15% (4 standard errors); two clients' independent draws have a correlation within 4/sqrt(360)
= 0.21 of 0. Poisson sampling takes q = 0.1 of 200 rows per step: a client's mean fraction over its 100 steps has a
standard error of sqrt(q(1 - q)/200/100) = 0.0021; the tolerance is 0.01 (4.7 standard errors).
"""

from __future__ import annotations

import copy
import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import Tensor, nn

from fdattack.cli import main
from fdattack.config import compose
from fdattack.data.imageset import ImageSet
from fdattack.defenses import dpsgd
from fdattack.defenses.dpsgd import DPSGDDefense, DPSGDSettings
from fdattack.engine import FitJob, FitResult, ModelHandle, default_engine
from fdattack.engine import vectorised as vectorised_api
from fdattack.engine.vectorised.ghost import GhostLinears
from fdattack.experiment import Experiment
from fdattack.lit.classifier import ClassifierLitModule, cross_entropy
from tests.conftest import own_messages, tiny

QUIET = ("evaluation.confidence_gap.enabled=false", "evaluation.classifier=null")
SIZES = (45, 23, 23, 22)  # with B = 8: q = 8/45 (5 Poisson steps an epoch) and 8/23, 8/22 (2 steps)
Sampler = Callable[[int, int, int], list[Tensor]]


@pytest.fixture
def private_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many models each vectorised DP-SGD call took (to tell the vectorised path from the opacus loop; where the
    engine has no such path, nothing is called and the tests' ``private_calls == [...]`` fail)."""
    taken: list[int] = []
    fit = getattr(vectorised_api, "fit_private_copies", None)

    def spy(jobs, *args, **kwargs):  # type: ignore[no-untyped-def]
        taken.append(len(jobs))
        return fit(jobs, *args, **kwargs)  # type: ignore[misc]

    monkeypatch.setattr(vectorised_api, "fit_private_copies", spy, raising=False)  # where the engine calls it
    return taken


def _conv_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 5))


def _sets(sizes: tuple[int, ...] = SIZES) -> list[ImageSet]:
    g = torch.Generator().manual_seed(1)
    return [ImageSet.from_images(torch.rand(n, 1, 8, 8, generator=g) * 2 - 1, torch.randint(0, 5, (n,), generator=g)) for n in sizes]


def _train(
    vectorise: str,
    nets: list[nn.Module],
    sets: list[ImageSet],
    settings: DPSGDSettings,
    *,
    epochs: int = 1,
    batch_size: int = 8,
    optimizer: str = "adam",
    lr: float = 0.05,
    sampler: Callable[[int], Sampler] | None = None,
    seed: int = 100,
) -> tuple[list[ModelHandle], list[FitResult], DPSGDDefense]:
    """Copies of ``nets`` trained on ``sets`` for one phase of DP-SGD (``sampler(k)`` replaces client k's Poisson sampler)."""
    engine = default_engine(batch_size=batch_size, vectorise=vectorise)
    defense = DPSGDDefense(settings, seed=0)
    handles, jobs = [], []
    for k, (net, data) in enumerate(zip(nets, sets)):
        net = defense.wrap_network(k, copy.deepcopy(net))
        handle = engine.setup(f"client{k}", ClassifierLitModule(net, 5, optimizer=optimizer, lr=lr))
        job = defense.wrap_job(k, "local_train", FitJob(handle, data, epochs, cross_entropy, seed + k), batch_size)
        handles.append(handle)
        jobs.append(job if sampler is None else replace(job, sampler=sampler(k)))
    return handles, engine.fit_many(jobs), defense


def _assert_same(a: list[ModelHandle], b: list[ModelHandle], tol: float = 1e-5) -> None:
    for x, y in zip(a, b, strict=True):
        for (name, t), u in zip(x.module.state_dict().items(), y.module.state_dict().values()):
            torch.testing.assert_close(t, u, rtol=tol, atol=tol, msg=f"{x.name} {name}")
        for p, state in x.optimizer.state_dict()["state"].items():
            for key, value in state.items():
                torch.testing.assert_close(value, y.optimizer.state_dict()["state"][p][key], rtol=tol, atol=tol, msg=f"{x.name} {key}")


def _histories(defense: DPSGDDefense) -> list[list]:
    return [a.history for _, a in sorted(defense.accountants.items())]


def _linear_net() -> nn.Module:
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2))
    nn.init.zeros_(net[1].weight)
    nn.init.zeros_(net[1].bias)
    return net


def _flat(handle: ModelHandle | nn.Module) -> Tensor:
    """Every parameter of a client's network (or of a network), flattened."""
    net = handle.module.net if isinstance(handle, ModelHandle) else handle
    return torch.cat([p.detach().flatten() for p in net.parameters()])


# ---------------------------------------------------------------------------------------------------- one step against opacus
def test_one_step_without_noise_is_opacus_step_with_each_samples_gradient_clipped(private_calls: list[int]) -> None:
    """Zero weights: p = (1/2, 1/2), so sample (x, y) has gradient dz = p - e_y = ±(1/2, -1/2): dW = dz xᵀ, db = dz, of
    norm sqrt(|x|²/2 + 1/2): 13^(1/2) > C = 1 for x = (3, 4), 0.625^(1/2) < C for x = (0.3, 0.4). One SGD step (lr 1)
    on both rows moves the weights by -(g1 · C/|g1| + g2) / B, the same on every client and under opacus."""
    images, labels = torch.tensor([[3.0, 4.0], [0.3, 0.4]]).view(2, 1, 1, 2), torch.tensor([0, 1])
    dz = {0: torch.tensor([-0.5, 0.5]), 1: torch.tensor([0.5, -0.5])}
    g1, g2 = (torch.cat([torch.outer(dz[y], x.flatten()).flatten(), dz[y]]) for x, y in zip(images, labels.tolist()))
    assert float(g1.norm()) == pytest.approx(math.sqrt(13)) and float(g2.norm()) < 1  # clipping binds on the first row only
    sets = [ImageSet.from_images(images, labels)] * 3
    settings = DPSGDSettings(noise_multiplier=0.0, max_grad_norm=1.0)
    whole = lambda k: lambda n, seed, size: [torch.arange(n)]  # noqa: E731 - the same batch (both rows) on both paths
    runs = {
        v: _train(v, [_linear_net()] * 3, sets, settings, batch_size=2, optimizer="sgd", lr=1.0, sampler=whole) for v in ("true", "false")
    }
    assert private_calls == [3]
    expected = -(g1 / (math.sqrt(13) + 1e-6) + g2) / 2  # opacus' factor C / (|g| + 1e-6)
    for vectorised, loop in zip(runs["true"][0], runs["false"][0]):
        torch.testing.assert_close(_flat(vectorised), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(_flat(vectorised), _flat(loop), rtol=1e-5, atol=1e-6)


def _mixed_net() -> nn.Module:
    """A convolution (per-sample gradients), a bias-free linear layer and a last one on one vector a row (ghost
    clipping), and a linear layer between them on two vectors a row (per-sample gradients)."""
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 8, bias=False), nn.ReLU(),
        nn.Unflatten(1, (2, 4)), nn.Linear(4, 5), nn.Flatten(), nn.Linear(10, 5),
    )  # fmt: skip


def test_ghost_clipping_takes_the_linear_layers_called_once_on_one_vector_a_row() -> None:
    net = _mixed_net()
    ghosts = GhostLinears(net, torch.zeros(1, 1, 8, 8))
    assert sorted(ghosts.layers) == ["4", "9"] and ghosts.parameters == {"4.weight", "9.weight", "9.bias"}
    assert type(net[4]) is nn.Linear and ghosts.template is not net  # the network itself is left as it was
    tied = nn.Linear(4, 4)
    assert sorted(GhostLinears(nn.Sequential(nn.Flatten(), nn.Linear(4, 4), tied, nn.ReLU(), tied), torch.zeros(1, 4)).layers) == ["1"]
    without = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())
    assert GhostLinears(without, torch.zeros(1, 1, 8, 8)).template is without


@pytest.mark.parametrize("build", [_conv_net, _mixed_net], ids=["conv net", "ghost-clipped and per-sample layers"])
def test_one_step_without_noise_equals_opacus(private_calls: list[int], build: Callable[[], nn.Module]) -> None:
    """C small enough to clip every row, one batch of each client's rows: the vectorised step equals opacus' (Adam's
    first step divides by the gradient's own size, so SGD shows more). In the mixed network each row's norm adds its
    ghost-clipped layers' ‖δ‖²(‖a‖² + 1) to the others' per-sample gradients: a norm missing a layer's share, or a layer
    clipped by the wrong factor, moves the step away from opacus' (which forms every per-sample gradient)."""
    torch.manual_seed(0)
    nets, sets = [build() for _ in SIZES], _sets()
    settings = DPSGDSettings(noise_multiplier=0.0, max_grad_norm=0.05)
    first = lambda k: lambda n, seed, size: [torch.arange(0, n, 2)]  # noqa: E731 - every other row, one step
    runs = {v: _train(v, nets, sets, settings, optimizer="sgd", lr=1.0, sampler=first) for v in ("true", "false")}
    assert private_calls == [4]
    _assert_same(runs["true"][0], runs["false"][0], tol=1e-5)
    moved = [float((_flat(h) - _flat(net)).norm()) for h, net in zip(runs["true"][0], nets)]
    for step, data in zip(moved, sets):  # every row clipped to C = 0.05: the step is at most C · (rows taken) / B
        assert step <= 0.05 * len(range(0, len(data), 2)) / 8 + 1e-6


# ---------------------------------------------------------------------------------------------------- noise
def test_noise_has_std_sigma_c_over_expected_batch_and_is_independent_across_clients(private_calls: list[int]) -> None:
    """Zero inputs give dW = 0, and the four clipped db = ±(1/2, -1/2) · C/|db| cancel: one SGD step (lr 1) is -noise / E.
    60 jobs per client (each its own noise seed) x 6 parameters = 360 draws per client."""
    images, labels = torch.zeros(4, 1, 1, 2), torch.tensor([0, 1, 0, 1])
    sigma, clip, clients = 2.0, 0.5, 3
    settings = DPSGDSettings(noise_multiplier=sigma, max_grad_norm=clip, poisson_sampling=False)
    sets = [ImageSet.from_images(images, labels)] * clients
    draws = torch.stack(
        [
            torch.stack(
                [
                    _flat(h)
                    for h in _train("true", [_linear_net()] * clients, sets, settings, batch_size=4, optimizer="sgd", lr=1.0, seed=s)[0]
                ]
            )
            for s in range(0, 60 * clients, clients)
        ],
        dim=1,
    ).flatten(1)  # (clients, 360)
    assert private_calls == [clients] * 60
    expected = sigma * clip / 4
    for row in draws:
        assert float(row.std()) == pytest.approx(expected, rel=0.15)
        assert abs(float(row.mean())) < 4 * expected / math.sqrt(row.numel())
    correlation = torch.corrcoef(draws)
    assert float((correlation - torch.eye(clients)).abs().max()) < 4 / math.sqrt(draws.shape[1])


# ---------------------------------------------------------------------------------------------------- Poisson sampling
@pytest.mark.parametrize(("poisson", "steps"), [(True, [10, 4, 4, 4]), (False, [12, 6, 6, 6])], ids=["poisson", "shuffled"])
def test_noisy_epochs_equal_the_opacus_loop_and_its_accountant(private_calls: list[int], poisson: bool, steps: list[int]) -> None:
    """Two epochs with noise, Adam, clients of 45, 23, 23 and 22 rows at B = 8: Poisson batches (sizes vary around B;
    int(n/B) steps an epoch: 5 or 2) or the shuffle (ceil(n/B) steps: 6 or 3, the last batch short); padded and
    masked, models sitting out the others' last steps. The same weights, optimizer states, steps, losses and
    accountant histories as opacus one client at a time."""
    torch.manual_seed(0)
    nets, sets = [_conv_net() for _ in SIZES], _sets()
    settings = DPSGDSettings(noise_multiplier=1.0, max_grad_norm=0.5, poisson_sampling=poisson)
    runs = {v: _train(v, nets, sets, settings, epochs=2) for v in ("true", "false")}
    assert private_calls == [4]
    (vec, vec_results, vec_defense), (loop, loop_results, loop_defense) = runs["true"], runs["false"]
    _assert_same(vec, loop)
    assert [r.steps for r in vec_results] == [r.steps for r in loop_results] == steps
    assert [r.mean_loss for r in vec_results] == pytest.approx([r.mean_loss for r in loop_results], rel=1e-5)
    assert _histories(vec_defense) == _histories(loop_defense) == [[(1.0, 8 / n, k)] for n, k in zip(SIZES, steps)]
    assert vec_defense.epsilons() == loop_defense.epsilons()


def test_poisson_sampling_takes_q_of_the_rows_per_step_in_batches_of_varying_size(private_calls: list[int]) -> None:
    drawn: dict[int, list[Tensor]] = {0: [], 1: []}

    def recording(k: int) -> Sampler:
        def sample(n: int, seed: int, size: int) -> list[Tensor]:
            batches = dpsgd.poisson_batches(n, seed, size)
            drawn[k].extend(batches)
            return batches

        return sample

    torch.manual_seed(0)
    sets = _sets((200, 200))
    _, results, _ = _train("true", [_conv_net()] * 2, sets, DPSGDSettings(), epochs=10, batch_size=20, sampler=recording)
    assert private_calls == [2]
    assert [r.steps for r in results] == [100, 100]  # int(1/q) = 10 steps an epoch, as opacus' sampler
    for batches in drawn.values():
        fractions = torch.tensor([len(b) / 200 for b in batches])
        assert float(fractions.mean()) == pytest.approx(0.1, abs=0.01)
        assert len({len(b) for b in batches}) > 5  # batch sizes vary
        assert all(len(set(b.tolist())) == len(b) for b in batches)  # a row at most once a step
    assert any(not torch.equal(a, b) for a, b in zip(drawn[0], drawn[1]))  # each client its own draws (its job's seed)


def test_an_empty_batch_is_a_noise_only_step_as_under_opacus(private_calls: list[int]) -> None:
    """Client 0 meets an empty batch at its first step, client 1 at its second, and at a third step both are empty:
    each such step is noise / E alone, counted as a step (and by the accountant), its loss not counted."""
    empty = torch.tensor([], dtype=torch.long)
    plans = {0: [empty, torch.tensor([0, 1, 2]), empty], 1: [torch.tensor([3, 4]), empty, empty]}
    torch.manual_seed(0)
    nets, sets = [_conv_net() for _ in range(2)], _sets((23, 22))
    settings = DPSGDSettings(noise_multiplier=1.0, max_grad_norm=0.5)
    runs = {v: _train(v, nets, sets, settings, sampler=lambda k: lambda n, seed, size: plans[k]) for v in ("true", "false")}
    assert private_calls == [2]
    (vec, vec_results, vec_defense), (loop, loop_results, loop_defense) = runs["true"], runs["false"]
    _assert_same(vec, loop)
    assert [r.steps for r in vec_results] == [r.steps for r in loop_results] == [3, 3]
    assert all(math.isfinite(r.mean_loss) for r in vec_results)
    assert [r.mean_loss for r in vec_results] == pytest.approx([r.mean_loss for r in loop_results], rel=1e-5)
    assert _histories(vec_defense) == _histories(loop_defense) == [[(1.0, 8 / 23, 3)], [(1.0, 8 / 22, 3)]]
    only_noise = _train("true", nets[:1] * 2, sets, settings, sampler=lambda k: lambda n, seed, size: [empty])[0]
    for handle, net in zip(only_noise, nets * 2):  # an all-empty step moves every model by Adam's step on noise / E
        assert not torch.equal(_flat(handle), _flat(net))


def test_networks_whose_per_sample_gradients_are_slower_vectorised_on_a_cpu_take_opacus(
    private_calls: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """A second convolution (on the first one's output, as in pdafd_cnn) takes opacus one client at a time on a CPU,
    said once in the log; the weights are those of trainer.vectorise=false."""
    torch.manual_seed(0)
    deeper = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 5))
    with caplog.at_level(logging.INFO, logger="fdattack.engine.trainer"):
        auto = _train("auto", [deeper] * 2, _sets((23, 22)), DPSGDSettings())[0]
    assert private_calls == []
    assert [m for m in own_messages(caplog) if "vectorise" in m] == [
        "trainer.vectorise=auto: training one model at a time where on a CPU, DP-SGD's per-sample gradients through a "
        "convolution of another layer's output are faster through opacus"
    ]
    _assert_same(auto, _train("false", [deeper] * 2, _sets((23, 22)), DPSGDSettings())[0], tol=0)


# ---------------------------------------------------------------------------------------------------- whole runs
def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "rounds.jsonl").read_text().splitlines()]


DSFL = (
    "protocol.name=dsfl",
    "protocol.num_clients=3",
    "protocol.private_epochs=2",
    "protocol.distill_epochs=1",
    "protocol.optim.batch_size=16",
)


#: 3x the spread of client_acc_mean over seeds 0-2 measured on the opacus path (0.300 to 0.352)
ACCURACY_MARGIN = 0.16


def _run(tmp_path: Path, vectorise: str, seed: int, *extra: str) -> Experiment:
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path / f"{vectorise}{seed}", *DSFL, "defenses=[dpsgd]", f"seed={seed}", f"trainer.vectorise={vectorise}", *QUIET, *extra
            ),
        )
    )
    exp.run()
    return exp


@pytest.mark.slow
def test_a_run_takes_the_vectorised_path_and_reports_the_opacus_paths_epsilon_and_accuracy(
    tmp_path: Path, private_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DS-FL on digits, 3 clients, 2 rounds, seeds 0-2, with trainer.vectorise=auto (vectorised) and false (opacus).
    Measured client_acc_mean over seeds 0, 1, 2: 0.300, 0.352, 0.300 on both paths (a spread of 0.052 over the seeds;
    the paths agree to float rounding, which moved no prediction). Asserted: the same accountant histories and ε every
    round, and each seed's accuracy and the mean over seeds within ACCURACY_MARGIN = 0.16 (3x the spread) of opacus'."""
    opened: list[str] = []
    session = dpsgd.private_steps

    def spy(handle, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(handle.name)
        return session(handle, **kwargs)

    monkeypatch.setattr(dpsgd, "private_steps", spy)
    accuracy: dict[str, list[float]] = {"auto": [], "false": []}
    for seed in range(3):
        runs = {}
        for vectorise in ("auto", "false"):
            opened.clear()
            runs[vectorise] = _run(tmp_path, vectorise, seed)
            accuracy[vectorise].append(_rows(tmp_path / f"{vectorise}{seed}" / "run")[-1]["protocol/client_acc_mean"])
            assert (opened == []) == (vectorise == "auto")  # auto never opens opacus' session; false trains every client through it
        assert _histories(runs["auto"].protocol.training_defenses[0]) == _histories(runs["false"].protocol.training_defenses[0])  # type: ignore[arg-type]
        eps = {v: [r["defense/dpsgd/epsilon"] for r in _rows(tmp_path / f"{v}{seed}" / "run")] for v in runs}
        assert eps["auto"] == eps["false"] and eps["auto"][-1] > 0
    assert private_calls and all(n == 3 for n in private_calls)
    assert all(abs(a - b) <= ACCURACY_MARGIN for a, b in zip(accuracy["auto"], accuracy["false"])), accuracy
    assert abs(sum(accuracy["auto"]) - sum(accuracy["false"])) / 3 <= ACCURACY_MARGIN


def test_resume_of_a_vectorised_dpsgd_run_matches_an_uninterrupted_run(tmp_path: Path, private_calls: list[int]) -> None:
    out = tmp_path / "run"
    args = ["run", *tiny(tmp_path, *DSFL, "protocol.rounds=2", "defenses=[dpsgd]", *QUIET)]  # resumed from round 1's checkpoint
    assert main(args) == 0
    assert private_calls
    finished, rows = json.loads((out / "metrics.json").read_text()), _rows(out)
    (out / "checkpoints" / "round_0002.pt").unlink()
    calls = len(private_calls)
    assert main([*args, "resume=true"]) == 0
    assert len(private_calls) > calls  # the resumed round trained on the vectorised path too

    def without_times(d: dict) -> dict:
        return {k: v for k, v in d.items() if not k.startswith("time/")}

    assert without_times(json.loads((out / "metrics.json").read_text())) == without_times(finished)
    assert [without_times(r) for r in _rows(out)] == [without_times(r) for r in rows]
