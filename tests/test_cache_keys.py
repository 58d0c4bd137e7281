"""Every cached kind's key is a digest of everything its training reads: each input changed alone names another entry
(issue 57: the evaluation classifier's key left out the batch size it trains with, and a run at another batch size read
the network trained at the first). The inputs are each key function's arguments, every field of a settings object and
every part of the engine's recipe."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest
import torch

from fdattack.attacks.gan_inversion import GANInversionSettings, gan_key
from fdattack.attacks.gmi import GMISettings
from fdattack.attacks.priors import PriorSettings, prior_key
from fdattack.code_version import source_digest
from fdattack.data.imageset import ImageSet
from fdattack.engine.trainer import default_engine
from fdattack.evaluation.identity import IdentityClasses, identity_key
from fdattack.evaluation.inversion_classifier import InversionEvaluationSettings, inversion_classifier_key
from tests.test_cached_networks import PLI, _entries, _run

RECIPE = default_engine().recipe()


def _images(n: int = 6, seed: int = 0) -> ImageSet:
    generator = torch.Generator().manual_seed(seed)
    return ImageSet.from_images(torch.rand(n, 1, 8, 8, generator=generator), torch.arange(n) % 3)


def _changed(value: Any) -> Iterator[tuple[str, Any]]:
    """(what changed, ``value`` with one thing changed) for each thing in ``value``: a dataclass field by field, a dict
    key by key, an image set's images and labels, a tensor's first element, any other value itself."""
    if isinstance(value, ImageSet):  # what a training reads of one (not its rows' sources)
        yield "images", ImageSet.from_images(value.images + 0.01, value.labels)
        yield "labels", ImageSet.from_images(value.images, value.labels.flip(0))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            for what, other in _changed(getattr(value, field.name)):
                yield f"{field.name}{'.' + what if what else ''}", dataclasses.replace(value, **{field.name: other})
    elif isinstance(value, dict):
        for key, item in value.items():
            for what, other in _changed(item):
                yield f"{key}{'.' + what if what else ''}", {**value, key: other}
    elif isinstance(value, torch.Tensor):
        other = value.clone()
        other.view(-1)[0] += 1
        yield "", other
    elif isinstance(value, enum.Enum):
        yield "", next(member for member in type(value) if member is not value)
    elif isinstance(value, bool):
        yield "", not value
    elif isinstance(value, (int, float)):
        yield "", value + 1
    elif isinstance(value, str):
        yield "", value + "x"
    elif isinstance(value, tuple):
        yield "", (*value, value[-1] if value else 1)
    elif isinstance(value, list):
        yield "", [*value, value[-1] if value else 1]
    elif value is None:
        yield "", 1
    else:
        raise TypeError(f"no change known for {value!r}")


def _each_input_names_another_key(key: Callable[..., str], inputs: dict[str, Any]) -> list[str]:
    """The key of ``inputs`` and of each change of one of them; fails where two are the same. Returns what changed."""
    keys = {"(none)": key(**inputs)}
    for name, value in inputs.items():
        for what, other in _changed(value):
            keys[f"{name}{'.' + what if what else ''}"] = key(**{**inputs, name: other})
    seen: dict[str, str] = {}
    for what, k in keys.items():
        assert k not in seen, f"changing {what} leaves the key of {seen.get(k)}"
        seen[k] = what
    return list(keys)


def test_the_engine_s_recipe_holds_what_a_fit_reads_from_it() -> None:
    assert default_engine(batch_size=16).recipe() != default_engine(batch_size=64).recipe()
    assert default_engine(vectorise=False).recipe() != default_engine().recipe()
    assert set(RECIPE) == {"batch_size", "vectorise", "world_size", "device", "precision", "code"}


def test_the_code_s_digest_changes_with_any_of_its_files(tmp_path: Path) -> None:
    def package(name: str, width: int) -> Path:
        folder = tmp_path / name / "trainer"
        folder.mkdir(parents=True)
        (folder / "loop.py").write_text("STEPS = 1\n")
        (folder / "net.py").write_text(f"WIDTH = {width}\n")
        return folder

    same, wider = package("a", 8), package("b", 9)
    assert source_digest(same) == source_digest(package("c", 8))  # the files' names and bytes, not where they lie
    assert source_digest(wider) != source_digest(same)
    assert source_digest(same / "loop.py") != source_digest(same)


def test_every_input_of_the_identity_classifier_names_another_entry() -> None:
    classes = IdentityClasses(_images(), ("private 0", "public look 0", "label 1"), (0,))
    inputs = dict(architecture="scnn", epochs=2, lr=1e-3, seed=0, classes=classes, recipe=RECIPE, code="c0")
    changed = _each_input_names_another_key(identity_key, inputs)
    assert {"recipe.batch_size", "classes.train.images", "classes.names", "code"} <= set(changed)


def test_every_input_of_the_inversions_evaluation_classifier_names_another_entry() -> None:
    inputs = dict(
        settings=InversionEvaluationSettings(), seed=0, image_shape=(1, 8, 8), train=_images(), num_classes=3, recipe=RECIPE, code="c0"
    )
    changed = _each_input_names_another_key(inversion_classifier_key, inputs)
    assert {"settings.batch_size", "settings.epochs", "recipe.precision", "train.labels"} <= set(changed)


def test_every_input_of_pli_s_learned_prior_names_another_entry() -> None:
    def key(public: ImageSet, blur: float, targets: list[int], num_classes: int, **rest: Any) -> str:
        with_domain = ImageSet.from_images(public.images, public.labels, domain=public.labels % 2)
        view = SimpleNamespace(public=with_domain, degradation=lambda x: x * blur, target_labels=targets, num_classes=num_classes)
        return prior_key(view, **rest)  # type: ignore[arg-type]

    inputs = dict(public=_images(), blur=0.5, targets=[0, 1], num_classes=3, settings=PriorSettings(), seed=0, recipe=RECIPE, code="c0")
    changed = _each_input_names_another_key(key, inputs)
    assert {"settings.epochs", "blur", "recipe.batch_size"} <= set(changed)


@pytest.mark.parametrize("settings", [GANInversionSettings(), GMISettings()], ids=["gan_inversion", "gmi"])
def test_every_input_of_a_gan_prior_names_another_entry(settings: GANInversionSettings) -> None:
    inputs = dict(seed=0, settings=settings, image_shape=(1, 16, 16), prior="p0", keys=(), recipe=RECIPE, code="c0")
    changed = _each_input_names_another_key(gan_key, inputs)
    assert {"settings.gan_batch_size", "settings.gan_epochs", "recipe.device"} <= set(changed)


def test_a_run_at_another_batch_size_trains_its_own_evaluation_classifier(tmp_path: Path) -> None:
    """The reported case: at ``protocol.optim.batch_size=16`` after a run at 64 on one cache, the evaluation classifier is
    trained anew, and the run scores as one without a cache."""
    cache, pli = tmp_path / "cache", [*PLI, "attack.pli.prior.kind=naive"]
    _run(tmp_path / "at64", None, *pli, f"cache_dir={cache}", "protocol.optim.batch_size=64")
    at16 = _run(tmp_path / "at16", None, *pli, f"cache_dir={cache}", "protocol.optim.batch_size=16")
    assert len([k for k in _entries(cache) if k.startswith("evaluation/identity")]) == 2
    alone = _run(tmp_path / "alone", None, *pli, "protocol.optim.batch_size=16")
    assert {k: v for k, v in at16.items() if "eval" in k} == {k: v for k, v in alone.items() if "eval" in k}
