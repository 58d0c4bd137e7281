"""Attacks see exactly their threat model, at run time.

On real runs of FedMD, FedGEMS and DS-FL with PLI and TBI, and of Cronus with TBI (``ATTACKS``):
(a) the outputs an attack trains on equal the clients' outputs at the attack point, recomputed from the
    models saved in that phase, and a query used after its phase raises;
(b) an object-graph walk from every attack and every record it receives finds no private tensor, no
    client model and nothing of the evaluation side (while a query is open it reaches the queried
    networks, and nothing private; once closed, not even those);
(c) on DS-FL the attack holds no public label.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import Tensor

from fdattack.attacks.base import Attack, AttackContext
from fdattack.attacks.pli import PLIAttack
from fdattack.attacks.pli_inputs import tempered_softmax
from fdattack.attacks.results import AttackResult
from fdattack.attacks.tbi import TBIAttack
from fdattack.config import compose
from fdattack.data.federated import FederatedData, FederatedSplit
from fdattack.data.imageset import UNLABELED
from fdattack.defenses import Release
from fdattack.engine import LocalTrainer, ModelHandle, predict_logits
from fdattack.evaluation import Evaluator, IdentityScorer, Oracle, ReconstructionScorer
from fdattack.evaluation.inversion import InversionScorer
from fdattack.evaluation.inversion_classifier import EvaluationClassifier
from fdattack.experiment import Experiment
from fdattack.fd.protocols.base import Protocol
from fdattack.fd.record import QueryRefusedError, RoundRecord, StaleQueryError
from fdattack.fd.threat import Undeclared
from fdattack.fd.uploads import as_sent
from fdattack.lit.classifier import ClassifierLitModule
from tests.conftest import REPO, tiny
from tests.object_graph import reachable

#: what no attack may reach: the ground truth, the protocol, its engine and its models
# attacks train on an engine of their own; the run's engine and Fabric list every client module
FORBIDDEN = (
    Oracle,
    FederatedSplit,
    FederatedData,
    Protocol,
    ModelHandle,
    ClassifierLitModule,
    Evaluator,
    ReconstructionScorer,
    IdentityScorer,
    InversionScorer,
    EvaluationClassifier,
    Experiment,
)
EXPERIMENTS = {"fedmd": "fedmd_digits", "fedgems": "fedgems_digits", "dsfl": "dsfl_digits", "cronus": "cronus_digits"}
ATTACKS = {"fedmd": ["pli", "tbi"], "fedgems": ["pli", "tbi"], "dsfl": ["pli", "tbi"], "cronus": ["tbi"]}
#: cronus_digits splits the digits at random (its targets have public images): TBI needs the PLI split's private targets
DATA = {"cronus": ["data.split=pli", "data.partition=disjoint_identities"]}
SMALL = [
    "attack.pli.max_width=16",
    "attack.tbi.max_width=16",
    "attack.pli.epochs_per_round=1",
    "attack.tbi.epochs_per_round=1",
    "attack.pli.prior.epochs=1",
    "attack.pli.prior.width=8",
    "evaluation.classifier=null",
    "evaluation.confidence_gap.enabled=false",
]


class Probe(Attack):
    """Runs after the real attacks: at the attack point it saves the models and what each attack collected."""

    name = "probe"

    def __init__(self, exp: Experiment) -> None:
        super().__init__(exp.view, None, AttackContext(seed=0))
        self.exp = exp  # the test's own handle on the run (never given to an attack)
        self.records: list[RoundRecord] = []
        self.models: dict[int | str, dict[str, Tensor]] = {}
        self.collected: dict[str, object] = {}
        self.open_walk: list[object] = []

    def on_record(self, record: RoundRecord) -> None:
        self.records.append(record)
        if not record.attack_point:
            return
        protocol = self.exp.protocol
        self.models = {k: copy.deepcopy(h.module.state_dict()) for k, h in enumerate(protocol.clients)}
        if protocol.server is not None:
            self.models["server"] = copy.deepcopy(protocol.server.module.state_dict())
        self.collected = {a.name: a.collected for a in self.exp.attacks if isinstance(a, (PLIAttack, TBIAttack))}
        self.open_walk = list(reachable(record))

    def on_round_end(self, round: int) -> list[AttackResult]:
        return []


#: a run seed no attack may hold (from it the run's secrets derive); distinctive, so that no other int equals it by chance
RUN_SEED = 3_735_928_559


def _run(tmp_path: Path, protocol: str) -> tuple[Experiment, Probe]:
    cfg = compose(
        REPO / "conf" / "experiment" / f"{EXPERIMENTS[protocol]}.yaml",
        tiny(
            tmp_path, "protocol.rounds=1", f"attacks=[{','.join(ATTACKS[protocol])}]", f"seed={RUN_SEED}", *SMALL, *DATA.get(protocol, [])
        ),
    )
    exp = Experiment(cfg)
    probe = Probe(exp)
    exp.observe(probe, query=True)
    exp.run()
    return exp, probe


def _sent_at(exp: Experiment, probe: Probe, model: int | str, rows: Tensor, tau: float, now: bool = False) -> Tensor:
    """softmax(output / tau) of ``model`` on public ``rows``, recomputed from the attack-point weights (or today's)."""
    handle = exp.protocol.server if model == "server" else exp.protocol.clients[int(model)]
    assert handle is not None
    module = copy.deepcopy(handle.module)
    if not now:
        module.load_state_dict(probe.models[model])
    logits = predict_logits(module, exp.data.split.public.images[rows], torch.device("cpu"), 512)
    if model == "server":
        return torch.softmax(logits / tau, dim=-1)
    kind, temperature = exp.protocol.upload_kind()
    sent, _ = as_sent(logits, temperature, exp.protocol.upload_defenses, Release(int(model), 0, "probe", kind, b""))
    return tempered_softmax(sent, kind, temperature, tau)


def _private_rows(split: FederatedSplit) -> Tensor:
    return torch.cat([p.images for p in split.private]).flatten(1)


def _assert_nothing_private(objects: list[object], split: FederatedSplit, run_engine: LocalTrainer | None = None) -> None:
    private = _private_rows(split)
    if run_engine is not None:
        ids = {id(o) for o in objects}
        assert id(run_engine) not in ids and id(run_engine.fabric) not in ids, "an attack reaches the run's engine"
    storages = {p.images.untyped_storage().data_ptr() for p in split.private} | {
        p.labels.untyped_storage().data_ptr() for p in split.private
    }
    for obj in objects:
        assert not isinstance(obj, FORBIDDEN), f"an attack reaches a {type(obj).__name__}"
        if torch.is_tensor(obj) and obj.numel():
            assert obj.untyped_storage().data_ptr() not in storages, "an attack reaches a private tensor"
            if obj.is_floating_point() and obj.numel() % private.shape[1] == 0:
                rows = obj.detach().reshape(-1, private.shape[1]).float()
                assert not bool((torch.cdist(rows, private) < 1e-6).any()), "an attack holds a private image"


@pytest.mark.parametrize("protocol", ["fedmd", "fedgems", "dsfl", "cronus"])
def test_attacks_see_exactly_their_threat_model(tmp_path: Path, protocol: str) -> None:
    exp, probe = _run(tmp_path, protocol)
    split = exp.data.split
    stale_at_end = protocol in ("dsfl", "cronus")  # clients distil after the attack point
    assert probe.collected and set(probe.collected) == set(ATTACKS[protocol])

    # (a) what each attack trains on is what the clients would send at the attack point
    for name, inputs in probe.collected.items():
        tau = next(a for a in exp.attacks if a.name == name).settings.tau
        if name == "pli":
            assert torch.allclose(inputs.server, _sent_at(exp, probe, "server", inputs.rows, tau), atol=1e-6)
            pairs = [(k, inputs.rows, out) for k, out in inputs.clients.items()]
        else:
            pairs = [(k, inputs.rows, out) for k, out in zip(exp.protocol.participants(1), inputs.outputs)]
        assert len(pairs) == exp.protocol.num_clients
        for k, rows, out in pairs:
            assert torch.allclose(out, _sent_at(exp, probe, k, rows, tau), atol=1e-6), (
                f"{name}: client {k}'s inputs are not its attack-point outputs"
            )
            # the check has teeth: where clients train after the attack point, today's models answer differently
            assert torch.allclose(out, _sent_at(exp, probe, k, rows, tau, now=True), atol=1e-6) != stale_at_end
    attack_point = next(r for r in probe.records if r.attack_point)
    assert attack_point.query is not None  # closed: asking it now is refused
    with pytest.raises(StaleQueryError, match=attack_point.phase):
        attack_point.query(attack_point.query.clients[0], attack_point.query.rows[:1])

    # (b) nothing private, no network, no ground truth, even while the query is open (its answerer stays protocol-side)
    _assert_nothing_private(probe.open_walk, split)
    nets = {id(h.module.net) for h in exp.protocol.clients} | ({id(exp.protocol.server.module.net)} if exp.protocol.server else set())
    assert probe.open_walk and not {id(o) for o in probe.open_walk} & nets
    assert not [o for o in probe.open_walk if isinstance(o, torch.nn.Module)]
    assert not {id(o) for o in reachable(*probe.records)} & nets
    attacks = [a for a in exp.attacks if a is not probe]
    _assert_nothing_private(list(reachable(*attacks, *probe.records)), split, exp.engine)
    # nor the run seed, nor a gradient of a private batch, anywhere an attack or a record leads
    held = list(reachable(*attacks, *probe.records, atoms=True))
    assert RUN_SEED not in [o for o in held if type(o) is int], "an attack holds the run seed"
    assert not [o for o in held if torch.is_tensor(o) and o.grad is not None], "an attack holds a tensor with a gradient"

    # (c) without public labels the attacker holds none
    if protocol in ("dsfl", "cronus"):
        assert bool((split.public.labels >= 0).any())
        for attack in attacks:  # those that read the public set
            assert isinstance(attack.view.public, Undeclared) or bool((attack.view.public.labels == UNLABELED).all())
        truth = split.public.labels
        for obj in reachable(*attacks, *probe.records):
            if torch.is_tensor(obj) and obj.shape == truth.shape and not obj.is_floating_point():
                assert not torch.equal(obj, truth), "an attack holds the public labels"


def test_query_grants_the_round_rows_and_answers_as_uploads(tmp_path: Path) -> None:
    """DS-FL with a public subset per round: queries refuse other rows; answers equal the uploads and pass the upload transforms."""
    cfg = compose(
        REPO / "conf" / "experiment" / "dsfl_digits.yaml",
        tiny(
            tmp_path, "protocol.rounds=1", "protocol.public_per_round=40", "evaluation.confidence_gap.enabled=false", "defenses=[rounding]"
        ),
    )
    exp = Experiment(cfg)

    class Checker(Attack):
        name = "checker"
        checked = 0

        def on_record(self, record: RoundRecord) -> None:
            if record.phase != "upload":
                return
            assert record.batch is not None
            query, rows = record.query, record.batch.rows
            assert query is not None and rows is not None and torch.equal(query.rows, rows) and len(rows) == 40
            for k, upload in record.uploads.items():
                answer = query(k, rows)
                assert torch.equal(answer, upload.outputs) and torch.equal(answer, torch.round(answer * 100) / 100)
            outside = torch.tensor([int(r) for r in range(len(exp.data.split.public)) if r not in set(rows.tolist())][:1])
            with pytest.raises(QueryRefusedError, match="rows outside"):
                query(0, outside)
            with pytest.raises(QueryRefusedError, match="no client"):
                query(5, rows)
            Checker.checked += 1

    exp.observe(Checker(exp.view, None, AttackContext(seed=0)), query=True)
    exp.run()
    assert Checker.checked == 1


def test_fedmd_queries_may_ask_for_any_public_row(tmp_path: Path) -> None:
    """FedMD as PLI runs it (pli.md §13.9): the server may query any public row, even outside the round's subset."""
    exp = Experiment(
        compose(None, tiny(tmp_path, "protocol.rounds=1", "protocol.public_per_round=30", "evaluation.confidence_gap.enabled=false"))
    )
    seen: list[int] = []

    class Checker(Attack):
        name = "checker"

        def on_record(self, record: RoundRecord) -> None:
            if record.attack_point and record.query is not None:
                n = len(exp.data.split.public)
                assert record.batch is not None and len(record.batch) == 30 and len(record.query.rows) == n
                seen.append(record.query(1, torch.tensor([0, n - 1])).shape[0])

    exp.observe(Checker(exp.view, None, AttackContext(seed=0)), query=True)
    exp.run()
    assert seen == [2]


def test_learned_prior_is_refused_without_public_labels(tmp_path: Path) -> None:
    """DS-FL declares its public set unlabeled, so PLI cannot build Eq. 9's per-label prior even when the data has labels."""
    from fdattack.errors import ConfigError

    overrides = tiny(tmp_path, "attacks=[pli]", "attack.pli.prior.kind=learned", "data.label_space=all")
    with pytest.raises(
        ConfigError,
        match=r"attacks: pli needs the public set's labels \(public_labels\), which protocol.name=dsfl does not offer here; "
        r"change attack.pli.\* \(its settings ask for it\)",
    ):
        compose(REPO / "conf" / "experiment" / "dsfl_digits.yaml", overrides)
