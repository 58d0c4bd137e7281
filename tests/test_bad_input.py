"""Every bad input is one line on stderr naming the key or file and what is allowed, exit status 2, no
traceback, nothing written (issue 10, item 7); and NaN scores are never hits."""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from lightning.fabric.accelerators import CUDAAccelerator, MPSAccelerator

from fdattack.cli import main
from fdattack.config import compose
from fdattack.config.composition import registries, schema_for
from fdattack.data.imageset import ImageSet
from fdattack.engine import FitJob, default_engine
from fdattack.errors import ConfigError
from fdattack.functional import topk_accuracy
from fdattack.functional.attack_accuracy import attack_accuracy
from fdattack.knobs import Range, _leaves
from fdattack.lit.classifier import ClassifierLitModule
from fdattack.lit.objectives import cross_entropy
from fdattack.models import build_classifier
from tests.conftest import error_of, tiny
from tests.test_data import _fake_faces


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], *named: str) -> str:
    """Run the CLI; assert exit 2, a single ``fdattack: error:`` line that contains every ``named`` text."""
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    err = error_of(err)
    assert "Traceback" not in err
    for text in named:
        assert text in err, (text, err)
    return err


# ----------------------------------------------------------------------------- data files
def _mnist_folder(root: Path, images_gz: bytes) -> Path:
    """A t10k pair whose images file holds ``images_gz`` and whose labels file is valid."""
    root.mkdir()
    (root / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(struct.pack(">II", 2049, 4) + bytes([0, 1, 2, 3]), mtime=0))
    images = root / "t10k-images-idx3-ubyte.gz"
    images.write_bytes(images_gz)
    return images


def _idx_images_gz() -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (4, 28, 28), dtype=np.uint8)
    return gzip.compress(struct.pack(">IIII", 2051, 4, 28, 28) + pixels.tobytes(), mtime=0)


def _corrupt_deflate() -> bytes:
    good = _idx_images_gz()
    bad = good[:10] + b"\xff" + good[11:]  # first deflate block header: BTYPE=11 is reserved
    with pytest.raises(zlib.error):  # what the old reader let through as a traceback
        gzip.decompress(bad)
    return bad


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(_corrupt_deflate, id="zlib_error"),
        pytest.param(lambda: _idx_images_gz()[:300], id="truncated_gz"),
        pytest.param(lambda: gzip.compress(struct.pack(">IIII", 1234, 4, 28, 28), mtime=0), id="bad_magic"),
    ],
)
def test_corrupt_mnist_gz_names_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, content: Any) -> None:
    images = _mnist_folder(tmp_path / "mnist", content())
    _one_line(capsys, ["run", "data.name=mnist", f"data.root={tmp_path / 'mnist'}", *tiny(tmp_path)], str(images))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (b"P5\n60000 60000\n255\n", "decompression bomb"),  # PIL raises DecompressionBombError (> 2x its pixel limit)
        (b"P5\n14000 14000\n255\n", "decompression bomb"),  # PIL only warns (DecompressionBombWarning): refused too
        (b"not an image at all", "cannot identify image file"),
    ],
)
def test_image_with_absurd_header_names_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, header: bytes, why: str) -> None:
    faces = tmp_path / "faces"
    _fake_faces(faces, subjects=4, per=2)
    bomb = faces / "s2" / "1.pgm"
    bomb.write_bytes(header + b"\x00" * 64)
    _one_line(capsys, ["run", "data.name=att_faces", f"data.root={faces}", "data.num_targets=2", *tiny(tmp_path)], str(bomb), why)
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- trainer, at config time
@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine has no GPU, whatever it really has."""
    for accelerator in (CUDAAccelerator, MPSAccelerator):
        monkeypatch.setattr(accelerator, "is_available", staticmethod(lambda: False))


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.accelerator=gpu", ["trainer.accelerator='gpu'", "no GPU", "available here: auto, cpu"]),
        ("trainer.accelerator=cuda", ["trainer.accelerator='cuda'", "available here: auto, cpu"]),
        ("trainer.accelerator=quantum", ["trainer.accelerator='quantum'", "available here: auto, cpu"]),
        ("trainer.precision=bogus", ["trainer.precision='bogus'", "32-true", "bf16-mixed", "16"]),
        ("trainer.strategy=bogus", ["trainer.strategy='bogus'", "ddp", "fsdp"]),
        ("trainer.devices=0", ["trainer.devices=0", "at least one device"]),
        ("trainer.devices=many", ["trainer.devices='many' with trainer.accelerator=cpu"]),
    ],
)
def test_trainer_keys_are_checked_before_anything_is_built(
    capsys: pytest.CaptureFixture[str], no_gpu: None, override: str, named: list[str]
) -> None:
    _one_line(capsys, ["run", override, "--print-config"], *named)  # --print-config builds nothing


def test_a_combination_only_lightning_refuses_is_one_line_and_writes_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _one_line(capsys, ["run", "trainer.accelerator=cpu", "trainer.strategy=fsdp", *tiny(tmp_path)], "trainer (", "strategy='fsdp'", "FSDP")
    assert not (tmp_path / "run").exists()


def test_bad_precision_in_a_run_command_has_no_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run command, not --print-config, in this process. A real process's exit status and stderr for a config error
    are tested once, by tests/test_cli.py::test_real_process_exit_status_and_stderr: its error too is found when the
    config is checked, after the same imports (Lightning's included), before anything is built or written."""
    assert main(["run", "trainer.precision=bogus", *tiny(tmp_path)]) == 2
    assert "trainer.precision='bogus'" in error_of(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- ranges
@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("seed=-1", "seed=-1 is out of range; allowed: [0, 4294967295]"),
        ("seed=4294967296", "seed=4294967296 is out of range"),
        ("data.seed=-1", "data.seed=-1 is out of range; allowed: null or [0, 4294967295]"),
        ("attack.pli.lr=inf", "attack.pli.lr=inf is out of range; allowed: a finite number > 0"),
        ("attack.pli.lr=nan", "attack.pli.lr=nan is out of range"),
        ("attack.tbi.lr=-inf", "attack.tbi.lr=-inf is out of range"),
        ("evaluation.confidence_gap.max_samples=0", "evaluation.confidence_gap.max_samples=0 is out of range; allowed: an integer >= 1"),
        ("data.image_size=100000", "data.image_size=100000 is out of range"),
    ],
)
def test_out_of_range_values_are_refused(capsys: pytest.CaptureFixture[str], override: str, named: str) -> None:
    _one_line(capsys, ["run", override, "--print-config"], named)


NUMBERS = {"int": int, "Optional[int]": int, "float": float, "Optional[float]": float}


def _ranged_knobs() -> Iterator[tuple[str, str, Range, type]]:
    """(protocol, key, range, int or float) of every numeric knob of the whole schema, each key once."""
    seen: set[str] = set()
    protocols, _, _ = registries()
    for protocol in protocols.names():
        for key, f, _ in _leaves(schema_for(protocol), ""):
            if str(f.type) in NUMBERS and key not in seen:
                seen.add(key)
                yield protocol, key, f.metadata["range"], NUMBERS[str(f.type)]


def _outside(bounds: Range, number: type) -> list[Any]:
    """Values just outside ``bounds``, and inf and NaN for a float knob."""
    if bounds.among is not None:
        return [max(bounds.among) + 1]
    values = [number(b) for b in (bounds.gt, bounds.lt) if b is not None]
    values += [number(bounds.ge) - 1] if bounds.ge is not None else []
    values += [number(bounds.le) + 1] if bounds.le is not None else []
    return values + (["inf", "-inf", "nan"] if number is float and bounds.finite else [])


def test_every_knob_with_a_range_refuses_values_outside_it_wherever_it_is_nested() -> None:
    knobs = list(_ranged_knobs())
    assert {
        "evaluation.confidence_gap.max_samples",
        "protocol.optim.lr",
        "attack.pli.prior.lr",
        "defense.laplace.scale",
        "protocol.filter_eps",
    } <= {key for _, key, _, _ in knobs}
    accepted = []
    for protocol, key, bounds, number in knobs:
        for value in _outside(bounds, number):
            try:
                compose(None, [f"protocol.name={protocol}", "attacks=[]", f"{key}={value}"])
                accepted.append(f"{key}={value}")
            except ConfigError as err:
                assert str(err).startswith(f"{key}="), err
    assert not accepted


def test_float_knobs_are_finite_unless_they_opt_out() -> None:
    assert not Range(gt=0).admits(math.inf) and not Range().admits(math.nan) and not Range(ge=0).admits(math.inf)
    assert Range(ge=0, finite=False).admits(math.inf) and Range().admits(1e300)


# ----------------------------------------------------------------------------- files and the command line
@pytest.mark.parametrize("text", ["", "# only a comment\n\n", "{}\n"])
def test_empty_experiment_file_is_refused_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    _one_line(capsys, ["run", str(empty), *tiny(tmp_path)], str(empty), "is empty")
    assert not (tmp_path / "run").exists()


def test_empty_group_file_is_refused_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "conf" / "protocol").mkdir(parents=True)
    (tmp_path / "conf" / "protocol" / "blank.yaml").write_text("# nothing yet\n")
    monkeypatch.chdir(tmp_path)
    _one_line(capsys, ["run", "protocol=blank", "--print-config"], "blank.yaml", "is empty")


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (b"seed: 3\nname: \xff\xfe\n", "not valid YAML"),  # not UTF-8
        (b"- a\n- list\n", "must hold a mapping"),
        (b"defaults:\n  - fedmd\n", "'defaults' must be a mapping group: name"),  # was an AttributeError traceback
    ],
)
def test_malformed_experiment_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: bytes, named: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(text)
    _one_line(capsys, ["run", str(bad), "--print-config"], str(bad), named)


def test_override_value_that_is_not_yaml_names_its_token(capsys: pytest.CaptureFixture[str]) -> None:
    _one_line(
        capsys,
        ["run", "seed=3", "evaluation={confidence_gap:{max_samples:0}}", "--print-config"],
        "evaluation={confidence_gap:{max_samples:0}}",
        "not valid YAML",
    )


# ----------------------------------------------------------------------------- registry names, each under its own key
CLASSIFIER_LIST = (
    "choose one of: fedinverse_cnn, lattack_cnn, lattack_mlp, mlp, mobilenet_v2, pdafd_cnn, pli_cnn, resnet18_gn, scnn, vgg16_bn"
)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model.clients=[pli_cnn,bogus]", f"model.clients[1]='bogus' is not a known classifier; {CLASSIFIER_LIST}"),
        ("evaluation.classifier=bogus", f"evaluation.classifier='bogus' is not a known classifier; {CLASSIFIER_LIST}"),
        ("model.server=bogus", f"model.server='bogus' is not a known classifier; {CLASSIFIER_LIST}"),
        ("model.name=bogus", f"model.name='bogus' is not a known classifier; {CLASSIFIER_LIST}"),
        ("data.name=bogus", "data.name='bogus' is not a known dataset; choose one of: att_faces, celeba"),
        ("data.aux_domain=bogus", "data.aux_domain='bogus' is not known; choose one of: blur, none, second_look"),
        (
            "attacks=[pli,bogus]",
            "attacks[1]='bogus' is not a known attack; choose one of: gmi, kedmi, lattack, ldia, lira_coop, lira_distill, pli, "
            "public_mean, rmia_coop, rmia_distill, tbi, vmi",
        ),
        ("defenses=[bogus]", "defenses[0]='bogus' is not a known defense; choose one of: bido, dpsgd, laplace, mid, rounding, topk"),
    ],
)
def test_registry_names_are_checked_at_config_time_under_their_own_key(
    capsys: pytest.CaptureFixture[str], override: str, named: str
) -> None:
    _one_line(capsys, ["run", override, "--print-config"], named)


# ----------------------------------------------------------------------------- sizes that cannot work, refused at once
SYNTHETIC = ["data.name=synthetic", "data.split=random"]  # 10 labels x 20 images: 40 public, 32 test, a pool of 128


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        pytest.param(  # was 1000 redraws (15 minutes at 100,000 clients of digits) before a message
            ["data.partition=dirichlet", "protocol.num_clients=200"],
            "protocol.num_clients=200 with data.partition=dirichlet needs at least 200 private samples (1 per client, "
            "data.min_client_size=1), but the clients' pool has only 128; use fewer clients",
            id="dirichlet",
        ),
        pytest.param(
            ["data.partition=dirichlet", "data.min_client_size=20"],
            "protocol.num_clients=8 with data.partition=dirichlet needs at least 160 private samples (20 per client",
            id="dirichlet_min_client_size",
        ),
        pytest.param(
            ["data.partition=iid", "protocol.num_clients=200"],
            "protocol.num_clients=200 with data.partition=iid needs at least 200 private samples (one per client), but the "
            "clients' pool has only 128",
            id="iid",
        ),
        pytest.param(
            ["data.partition=shards", "protocol.num_clients=65"],
            "protocol.num_clients=65 with data.partition=shards needs at least 130 private samples (data.shards_per_client=2 "
            "non-empty shards per client), but the clients' pool has only 128",
            id="shards",
        ),
        pytest.param(
            ["data.partition=two_classes", "protocol.num_clients=11"],
            "protocol.num_clients=11 with data.partition=two_classes needs at least 11 private classes",
            id="two_classes",
        ),
    ],
)
def test_partitions_that_cannot_fill_every_client_are_refused_before_any_draw(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, overrides: list[str], named: str
) -> None:
    _one_line(capsys, ["run", *tiny(tmp_path, *SYNTHETIC, "protocol.num_clients=8", *overrides)], named)
    assert not (tmp_path / "run").exists()


def test_more_clients_than_target_labels_is_refused_by_the_split_or_at_config_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    named = "protocol.num_clients=6 with data.partition=disjoint_identities needs at least 6 target labels (one identity per client)"
    _one_line(capsys, ["run", *tiny(tmp_path, "protocol.num_clients=6")], named, "but the split has only 5")  # digits: 10 labels
    _one_line(capsys, ["run", "protocol.num_clients=6", "data.num_targets=5", "--print-config"], named)


# ----------------------------------------------------------------------------- membership attacks and BatchNorm, at config time
@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        pytest.param(
            ["evaluation.max_candidates=4", "attacks=[lira_coop]"],
            ["evaluation.max_candidates=4 with attacks=[lira_coop]", "each of the 4 clients", "so at least 5"],
            id="fewer_candidates_than_clients",
        ),
        pytest.param(
            ["protocol.num_clients=2", "attacks=[lira_coop]"],
            ["attacks: lira_coop needs at least 3 clients (a target and the other clients as its references", "set protocol.num_clients=3"],
            id="too_few_clients_for_coop_lira",
        ),
        pytest.param(
            ["model.name=mobilenet_v2", "protocol.optim.batch_size=1"],
            ["protocol.optim.batch_size=1: model.name=mobilenet_v2 has BatchNorm", "protocol.optim.batch_size >= 2"],
            id="batch_norm_client",
        ),
        pytest.param(
            ["model.clients=[pli_cnn,scnn]", "protocol.optim.batch_size=1"],
            ["protocol.optim.batch_size=1: model.clients[1]=scnn has BatchNorm"],
            id="batch_norm_among_clients",
        ),
        pytest.param(
            ["model.server=vgg16_bn", "protocol.optim.batch_size=1"],
            ["protocol.optim.batch_size=1: model.server=vgg16_bn has BatchNorm"],
            id="batch_norm_server",
        ),
        pytest.param(
            ["evaluation.classifier=fedinverse_cnn", "protocol.optim.batch_size=1", "attacks=[pli]"],
            ["protocol.optim.batch_size=1: evaluation.classifier=fedinverse_cnn has BatchNorm"],
            id="batch_norm_evaluation_classifier",
        ),
        pytest.param(
            ["isolation.seconds=60"],
            ["isolation.seconds=60.0: budgets apply to attack workers; set isolation.mode=process"],
            id="budget_without_workers",
        ),
        pytest.param(
            ["isolation.overlap=true"],
            ["isolation.overlap=true: only attack workers end rounds beside the simulation; set isolation.mode=process"],
            id="overlap_without_workers",
        ),
    ],
)
def test_settings_no_run_could_use_are_refused_at_config_time(
    capsys: pytest.CaptureFixture[str], overrides: list[str], named: list[str]
) -> None:
    _one_line(capsys, ["run", *overrides, "--print-config"], *named)


@pytest.mark.parametrize("attacks", ["[lira_coop]", "[ldia,lira_distill]"])
def test_membership_attacks_without_a_test_set_are_refused_once_the_split_is_cut(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, attacks: str
) -> None:
    """Issue 30: data.test_fraction=0 with a LiRA attack ran to exit 0 with 0 clients scored. Every client's non-members
    come from the test set, empty here (digits has no test split of its own; a dataset with one is not refused)."""
    named = "score each client's members against non-members from the test set, which is empty (data.test_fraction=0.0"
    overrides = ("data.test_fraction=0", f"attacks={attacks}", "protocol.num_clients=3")  # lira_coop needs three clients
    _one_line(capsys, ["run", *tiny(tmp_path, *overrides)], named, "set data.test_fraction > 0")
    assert not (tmp_path / "run").exists()


def test_a_learned_prior_with_no_public_look_is_one_line_before_any_round(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """data.aux_domain=none leaves no identity in both looks: the CycleGAN prior raised a ValueError traceback after the
    first round; now the attack's construction refuses it, naming the keys, and nothing is written."""
    overrides = ("data.aux_domain=none", "attacks=[pli]")
    _one_line(capsys, ["run", *tiny(tmp_path, *overrides)], "attack.pli.prior.kind=learned", "data.aux_domain=none")
    assert not (tmp_path / "run").exists()


def test_an_evaluation_classifier_that_diverges_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """evaluation.lr=1e30 left the classifier's weights NaN and every eval_* metric null without a word (issue 46); the
    run now stops with one line naming the key, once the classifier has trained."""
    overrides = ("protocol.rounds=1", "attacks=[public_mean]", "evaluation.epochs=1", "evaluation.lr=1e30")
    _one_line(capsys, ["run", *tiny(tmp_path, *overrides)], "evaluation classifier diverged", "evaluation.lr=1e+30")
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.parametrize(
    "overrides",
    [
        ["data.test_fraction=0", "attacks=[pli]"],  # no membership attack: nothing to score against the test set
        ["evaluation.max_candidates=5", "attacks=[lira_coop]"],
        ["protocol.optim.batch_size=1", "attacks=[]"],  # pli_cnn has no BatchNorm
        ["model.server=vgg16_bn", "protocol.server_model=false", "protocol.optim.batch_size=1", "attacks=[]"],  # no server trained
    ],
)
def test_the_same_keys_pass_where_they_can_work(capsys: pytest.CaptureFixture[str], overrides: list[str]) -> None:
    assert main(["run", *overrides, "--print-config"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("vectorise", ["false", "auto"])
def test_a_batch_norm_network_on_one_row_takes_no_step_instead_of_raising(vectorise: str) -> None:
    """A client holding a single private sample (or 4k + 1 of them at batch size 4): BatchNorm cannot train on a batch of
    one row (here scnn's 1x1 feature map raised "Expected more than 1 value per channel when training")."""
    engine = default_engine(batch_size=4, vectorise=vectorise)
    jobs = []
    for k, rows in enumerate((1, 5, 4)):
        torch.manual_seed(k)
        handle = engine.setup(f"client{k}", ClassifierLitModule(build_classifier("scnn", 1, 8, 10), 10))
        jobs.append(FitJob(handle, ImageSet.from_images(torch.randn(rows, 1, 8, 8), torch.arange(rows) % 10), 2, cross_entropy, k))
    assert [r.steps for r in engine.fit_many(jobs)] == [0, 2, 2]  # the 5th row of client 1 left out, as before


# ----------------------------------------------------------------------------- NaN scores are never hits
def test_nan_reconstructions_are_misses_and_all_nan_gives_nan_accuracy() -> None:
    means = torch.stack([torch.full((1, 8, 8), v) for v in (-0.5, 0.0, 0.5)])
    means = means + 0.3 * torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    public = torch.full_like(means, float("nan"))
    labels = torch.tensor([0, 1, 2])
    assert attack_accuracy(means.clone(), labels, means, public).accuracy == 1.0  # sanity: exact copies hit
    nan_recon = torch.full_like(means, float("nan"))
    all_nan = attack_accuracy(nan_recon, labels, means, public)
    assert math.isnan(all_nan.accuracy) and not all_nan.success.any() and all_nan.too_close_to_public == 0
    one_nan = means.clone()
    one_nan[0] = float("nan")  # label 0: the old argmax over all -inf picked index 0, a hit
    result = attack_accuracy(one_nan, labels, means, public)
    assert result.success.tolist() == [False, True, True] and result.accuracy == pytest.approx(2 / 3)


def test_nan_logits_never_rank_first() -> None:
    labels = torch.tensor([0, 1, 2])
    assert math.isnan(topk_accuracy(torch.full((3, 3), float("nan")), labels, 1))
    assert math.isnan(topk_accuracy(torch.full((3, 3), float("nan")), labels, 5))
    logits = torch.tensor([[float("nan")] * 3, [0.0, 1.0, 0.5], [float("nan"), 0.0, float("nan")]])
    assert topk_accuracy(logits, labels, 1) == pytest.approx(1 / 3)  # row 0 all NaN: a miss, not a hit on 0
    assert topk_accuracy(logits, torch.tensor([0, 1, 0]), 2) == pytest.approx(1 / 3)  # row 2's own logit is NaN: a miss
    assert topk_accuracy(logits, torch.tensor([0, 1, 1]), 1) == pytest.approx(2 / 3)  # a NaN rival does not outrank 0.0
