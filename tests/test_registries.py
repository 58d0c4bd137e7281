"""Registries and per-component configs: old keys point to new ones, enums and ranges next to the fields,
compatibility from declared needs and offers, and a new attack as one file plus one registry line."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from fdattack.attacks import ATTACKS
from fdattack.attacks.public_mean import public_means
from fdattack.cli import main
from fdattack.config import compose, help_config
from fdattack.errors import ConfigError
from fdattack.experiment import Experiment, run
from tests.conftest import REPO, tiny


def test_old_flat_attack_keys_name_their_new_place(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^command line: attack.tau has moved to attack.pli.tau and attack.tbi.tau"):
        compose(None, ["attack.tau=1"])
    with pytest.raises(
        ConfigError,
        match=r"attack.tbi_last_client_only has moved to attack.tbi.last_client_only$"
        r"|attack.tbi_last_client_only has moved to attack.tbi.last_client_only \(",
    ):
        compose(None, ["attack.tbi_last_client_only=true"])
    old = tmp_path / "old.yaml"
    old.write_text("attacks: [pli]\nattack: {gamma: 0.3, prior: {epochs: 3}}\n")
    with pytest.raises(ConfigError, match=rf"^{old}: attack.gamma has moved to attack.pli.gamma"):
        compose(old, [])


def test_the_old_observers_keys_name_their_place_on_the_evaluation_side(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^command line: observers.confidence_gap has moved to evaluation.confidence_gap \("):
        compose(None, ["observers.confidence_gap.enabled=false"])
    old = tmp_path / "old.yaml"
    old.write_text("observers: {confidence_gap: {bins: 5}}\n")
    with pytest.raises(ConfigError, match=rf"^{old}: observers.confidence_gap has moved to evaluation.confidence_gap"):
        compose(old, [])
    assert compose(None, ["evaluation.confidence_gap.bins=5"]).evaluation.confidence_gap.bins == 5


def test_old_key_on_the_command_line_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """In this process: a real process's exit status and stderr for a config error are tested once, by
    tests/test_cli.py::test_real_process_exit_status_and_stderr."""
    assert main(["run", "attack.gamma=0.1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "fdattack: error: command line: attack.gamma has moved to attack.pli.gamma (each attack has its own knobs under attack.<name>)"
    ]


def test_choices_and_ranges_are_checked_from_the_fields() -> None:
    with pytest.raises(ConfigError, match=r"attack.pli.variant.*Invalid value 'sideways', expected one of \[full, client_only\]"):
        compose(None, ["attack.pli.variant=sideways"])
    with pytest.raises(ConfigError, match=r"^attack.pli.tau=0.0 is out of range; allowed: a number > 0$"):
        compose(None, ["attack.pli.tau=0"])
    with pytest.raises(ConfigError, match=r"^defense.topk.k=0 is out of range; allowed: an integer >= 1$"):
        compose(None, ["defense.topk.k=0"])
    with pytest.raises(ConfigError, match=r"^protocol.filter_eps=0.7 is out of range; allowed: \(0, 0.5\)$"):
        compose(None, ["protocol.name=cronus", "protocol.filter_eps=0.7"])
    with pytest.raises(ConfigError, match=r"unknown config key 'attack.pli.taux'"):
        compose(None, ["attack.pli.taux=1"])
    with pytest.raises(
        ConfigError,
        match=r"attacks\[0\]='pl' is not a known attack; choose one of: "
        r"gmi, kedmi, lattack, ldia, lira_coop, lira_distill, pli, public_mean, rmia_coop, rmia_distill, tbi, vmi",
    ):
        compose(None, ["attacks=[pl]"])
    with pytest.raises(
        ConfigError, match=r"defenses\[0\]='noise' is not a known defense; choose one of: bido, dpsgd, laplace, mid, rounding, topk"
    ):
        compose(None, ["defenses=[noise]"])
    cfg = compose(None, ["attack.pli.variant=client_only", "attack.pli.prior.kind=naive"])
    assert cfg.attack.pli.variant == "client_only" and f"{cfg.attack.pli.prior.kind}" == "naive"


def test_compatibility_comes_from_declared_needs_and_offers() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^attacks: pli needs a server model f_0 \(server_model\), which protocol.name=fedmd does not offer here; "
        r"set protocol.server_model=true$",
    ):
        compose(None, ["attacks=[pli]", "protocol.server_model=false"])
    compose(None, ["attacks=[tbi]", "protocol.server_model=false"])  # TBI declares no server model
    with pytest.raises(
        ConfigError,
        match=r"^attacks: tbi needs a public set \(public_data\), the clients' outputs on public data "
        r"\(public_outputs\), which protocol.name=fedavg does not offer here; remove tbi from attacks$",
    ):
        compose(REPO / "conf" / "experiment" / "fedavg_digits.yaml", ["attacks=[tbi]"])
    with pytest.raises(
        ConfigError, match=r"^defenses: laplace needs uploads of outputs on public data \(output_uploads\), which protocol.name=fedavg"
    ):
        compose(REPO / "conf" / "experiment" / "fedavg_digits.yaml", ["defenses=[laplace]"])
    with pytest.raises(ConfigError, match=r"attacks=\['tbi', 'tbi'\]: tbi listed twice"):
        compose(None, ["attacks=[tbi,tbi]"])


def test_the_data_split_offers_what_the_protocol_cannot() -> None:
    """A reconstruction attack needs targets without public images, a GAN inversion the attacker's prior data, the
    L-Attack a protocol that declares its server's rule and a split that fixes its class c* as a target: refused before
    any data is loaded, naming the fix."""
    random_split = ["data.split=random", "data.partition=iid"]
    with pytest.raises(
        ConfigError,
        match=r"^attacks: pli needs target labels without images in the public set \(private_targets\), which data.split=random "
        r"does not offer; set data.split=pli or data.split=classes",
    ):
        compose(None, ["attacks=[pli]", *random_split])
    compose(
        None, ["attacks=[pli]", *random_split, "data.public_dataset.name=noise", "data.public_dataset.size=50"]
    )  # a foreign public set has no targets
    with pytest.raises(ConfigError, match=r"^attacks: gmi needs labeled prior data of the attacker's own \(prior_data\)"):
        compose(REPO / "conf" / "experiment" / "fedavg_digits.yaml", ["attacks=[gmi]", "data.split=pli", "data.partition=iid"])
    compose(REPO / "conf" / "experiment" / "kedmi_fedavg_digits.yaml", ["attacks=[gmi]"])
    with pytest.raises(ConfigError, match=r"^attacks: lattack needs the server's declared aggregation rule \(aggregation_rule\), which "):
        compose(None, ["attacks=[lattack]", "protocol=dsfl", "data=digits_lattack"])
    with pytest.raises(ConfigError, match=r"^attacks: lattack needs every private class a target, fixed .*data=digits_lattack"):
        compose(None, ["attacks=[lattack]", "protocol=labelavg"])  # the PLI split draws its targets with the seed
    compose(None, ["attacks=[lattack]", "protocol=labelavg", "data=digits_lattack"])


def test_help_config_documents_every_registered_component() -> None:
    text = help_config()
    for name in ATTACKS.names():
        assert f"attack.{name} (attacks=[{name}]" in text
    for key in (
        "attack.pli.tau",
        "attack.pli.prior.kind",
        "attack.tbi.last_client_only",
        "defense.laplace.scale",
        "defense.topk.k",
        "defense.rounding.decimals",
        "protocol.era_temperature",
    ):
        assert f"\n  {key} " in text
    assert "[full | client_only]" in text and "[> 0]" in text
    # setting-dependent needs: LiRA's default insert=query asks for the server's query power
    assert "attack.lira_coop (attacks=[lira_coop]; needs with these defaults: output_uploads, query_chosen_batch)" in text


NEW_ATTACK = '''
"""A test attack: every target reconstructed as a constant grey image."""
from dataclasses import dataclass

import torch

from fdattack.attacks import ATTACKS, Attack
from fdattack.attacks.results import Reconstructions
from fdattack.knobs import knob
from fdattack.fd.threat import Capability


@dataclass
class GreySettings:
    level: float = knob(0.0, "the grey level in [-1, 1]", ge=-1, le=1)


@ATTACKS.register("grey")
class GreyAttack(Attack):
    name = "grey"
    Settings = GreySettings
    needs = frozenset({Capability.public_data})
    produces = frozenset({Reconstructions})

    def on_round_end(self, round):
        c, h, w = self.view.image_shape
        targets = torch.tensor(self.view.target_labels)
        return [Reconstructions(torch.full((len(targets), c, h, w), self.settings.level), targets)]
'''


def test_a_new_attack_is_one_file_and_one_registry_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file defines the attack, its settings and needs; registering it is its decorator line. Config, help,
    compatibility, the run and the scoring pick it up with nothing else changed."""
    monkeypatch.setattr(ATTACKS, "_items", dict(ATTACKS._items))  # leave the real registry as it was
    (tmp_path / "grey_attack.py").write_text(NEW_ATTACK)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("grey_attack")
    monkeypatch.delitem(sys.modules, "grey_attack")
    assert "attack.grey.level" in help_config()
    with pytest.raises(ConfigError, match=r"attack.grey.level=2.0 is out of range"):
        compose(None, tiny(tmp_path, "attacks=[grey]", "attack.grey.level=2"))
    metrics = run(
        compose(
            None,
            tiny(
                tmp_path,
                "attacks=[grey,public_mean]",
                "attack.grey.level=0.5",
                "protocol.rounds=1",
                "evaluation.classifier=null",
                "evaluation.confidence_gap.enabled=false",
            ),
        )
    )
    assert {"attack/grey/accuracy", "attack/grey/ssim", "attack/public_mean/ssim"} <= set(metrics)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert rounds[-1]["attack/grey/ssim"] == metrics["attack/grey/ssim"]


def test_public_mean_is_the_per_label_mean_of_the_public_images(tmp_path: Path) -> None:
    exp = Experiment(compose(None, tiny(tmp_path, "attacks=[public_mean]", "evaluation.classifier=null")))
    view = exp.view
    assert view.public is not None
    means = public_means(view, per_label=True)
    for row, j in enumerate(view.target_labels):
        torch.testing.assert_close(means[row], view.public.images[view.public.labels == j].mean(0))
    sensitive_mean = view.public.images[view.public.domain == 0].mean(0)
    assert all(torch.equal(m, sensitive_mean) for m in public_means(view, per_label=False))
