"""Attacks that try to cheat, and fail (issue 28): each test runs a deliberately dishonest attack through a real FedMD
run and asserts that the attempt ends in an error or gains nothing.

Closed: attacker-made tensor subclasses (handed to queries, the adversary's powers, the answerer or the evaluator,
their ``__torch_function__`` would see the clients' weights or the ground truth), powers widened or queues written past
the adversary's checks (the protocol checks its own record of the grant), writing into the public images of the view
(each attack's own copy), view parts an attack did not declare (the membership candidates, the prior data, the public
set, the server's rule), queries after phases whose states never cross the wire, the run seed (the attacker's is
derived from it; none in the environment or ``torch.initial_seed()``), the live answerer behind a query, FedAvg's
uploads in a participant's records, the labelled public set as DS-FL's and Cronus's prior data, the ``.grad`` of the
last private mini-batch left on trained networks, and a path from the attack-state store to the run directory.

Closed in process for honest mistakes (issue 47): the global generators (an attack reads neither the run seed nor a
protocol draw there, and its own draws or seeding move none of the protocol's), a record written in place (each
observer gets its own copy), and result fields or query rows that are not plain data (a ``str`` subclass, ``__array__``).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fdattack.assembly import membership_candidates
from fdattack.attacks import ATTACKS, Attack
from fdattack.attacks.results import Reconstructions
from fdattack.config import compose
from fdattack.data.imageset import ImageSet
from fdattack.defenses.base import Release
from fdattack.defenses.laplace import laplace_noise
from fdattack.evaluation.candidates import candidate_pool
from fdattack.experiment import Experiment
from fdattack.fd.boundary import BoundaryError
from fdattack.fd.record import QueryRefusedError, RoundRecord, StaleQueryError
from fdattack.fd.threat import Capability, Undeclared, UndeclaredPartError, ViewPart
from fdattack.fd.uploads import batch_key
from fdattack.randomness import derive_seed
from fdattack.vocabulary import SERVER_POWERS
from tests.conftest import REPO, tiny
from tests.object_graph import reachable


class Spy(torch.Tensor):
    """A tensor that records every other tensor a torch call made with it receives."""

    seen: list[torch.Tensor] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        Spy.seen.extend(a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor) and not isinstance(a, Spy))
        return super().__torch_function__(func, types, args, kwargs)


def spy(shape: tuple[int, ...]) -> Spy:
    made = torch.zeros(shape).as_subclass(Spy)
    Spy.seen = []
    return made  # type: ignore[return-value]


@dataclass
class CheatSettings:
    pass


class CheatingAttack(Attack):
    """Runs ``cheat(self, record)`` on every record, and ``result(self)`` (if set) at the end of every round."""

    name = "cheat"
    Settings = CheatSettings
    needs: frozenset[Capability] = frozenset()
    produces = frozenset({Reconstructions})
    cheat: Callable[["CheatingAttack", RoundRecord], None] = staticmethod(lambda attack, record: None)  # type: ignore[assignment]
    result: Callable[["CheatingAttack"], Any] | None = None
    outcome: dict[str, object] = {}

    def on_record(self, record: RoundRecord) -> None:
        type(self).cheat(self, record)

    def on_round_end(self, round: int) -> list:
        return [] if type(self).result is None else [type(self).result(self)]  # type: ignore[misc]


def _cheater(
    monkeypatch: pytest.MonkeyPatch,
    cheat: Callable[[CheatingAttack, RoundRecord], None],
    needs: frozenset[Capability] = frozenset(),
    result: Callable[[CheatingAttack], Any] | None = None,
    reads: frozenset[ViewPart] = frozenset({ViewPart.public}),
    queries: bool = True,
) -> type[CheatingAttack]:
    """A registered cheating attack; ``queries``: it declares ``public_outputs`` (its records carry a query handle)."""
    needs = needs | {Capability.public_outputs} if queries else needs
    cls = type(
        "Cheater",
        (CheatingAttack,),
        {"cheat": staticmethod(cheat), "needs": needs, "reads": reads, "result": staticmethod(result) if result else None},
    )
    cls.outcome = {}
    monkeypatch.setattr(ATTACKS, "_items", {**ATTACKS._items, "cheat": cls})
    return cls  # type: ignore[return-value]


def _experiment(tmp_path: Path, *extra: str) -> Experiment:
    return Experiment(
        compose(None, tiny(tmp_path, "attacks=[cheat]", "evaluation.confidence_gap.enabled=false", "evaluation.classifier=null", *extra))
    )


def _parameters(exp: Experiment) -> set[int]:
    return {p.untyped_storage().data_ptr() for c in exp.protocol.clients for p in c.module.parameters()}


def _tries(outcome: dict[str, object], key: str, attempt: Callable[[], object]) -> None:
    """Record the exception type an attempt raised (or "accepted")."""
    try:
        attempt()
        outcome[key] = "accepted"
    except Exception as err:  # the test asserts which one
        outcome[key] = type(err)


def test_a_tensor_subclass_is_refused_wherever_an_attack_hands_one_to_the_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the adversary's query and its other powers and the public query: refused by type, before any torch call
    could hand the spy a client's weights."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        adversary, out = attack.context.adversary, attack.outcome
        if record.round != 1 or record.phase != "upload" or adversary is None:
            return
        shape = (2, *attack.view.image_shape)
        _tries(out, "query", lambda: adversary.query(0, spy(shape)))
        _tries(out, "add", lambda: adversary.add_public_samples(spy(shape)))
        _tries(out, "rows", lambda: adversary.choose_public_rows(torch.arange(3).as_subclass(Spy)))
        _tries(out, "aggregate", lambda: adversary.send_aggregate(0, spy((4, attack.view.num_classes))))
        assert record.query is not None
        _tries(out, "public_query", lambda: record.query(0, torch.arange(3).as_subclass(Spy)))  # type: ignore[misc]
        out["seen"] = list(Spy.seen)

    cheater = _cheater(monkeypatch, cheat, frozenset(SERVER_POWERS))
    exp = _experiment(tmp_path)
    exp.run()
    seen = cheater.outcome.pop("seen")
    assert cheater.outcome == {key: BoundaryError for key in ("query", "add", "rows", "aggregate", "public_query")}
    weights = _parameters(exp)
    assert not [t for t in seen if t.untyped_storage().data_ptr() in weights]  # type: ignore[union-attr]


def test_widened_powers_and_queues_written_directly_are_refused_by_the_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Granted only queries on chosen images, the attack widens its ``powers`` and queues rows: the protocol, which keeps
    its own record of the grant, stops the run at the next draw and names the power."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        adversary = attack.context.adversary
        if record.round == 1 and record.phase == "upload" and adversary is not None:
            adversary.powers = frozenset(SERVER_POWERS)
            adversary.choose_public_rows(torch.arange(4))

    _cheater(monkeypatch, cheat, frozenset({Capability.query_chosen_batch}))
    with pytest.raises(QueryRefusedError, match="choose_public_batch, which it was not granted"):
        _experiment(tmp_path).run()


def test_an_aggregate_queued_past_the_checks_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        adversary = attack.context.adversary
        if record.round == 1 and record.phase == "upload" and adversary is not None:
            adversary._aggregates[0] = torch.zeros(1)  # written directly: no power, no check on this side

    _cheater(monkeypatch, cheat, frozenset({Capability.query_chosen_batch}))
    with pytest.raises(QueryRefusedError, match="send_aggregate, which it was not granted"):
        _experiment(tmp_path).run()


def test_an_attack_without_the_query_power_gets_no_answerer_even_when_it_widens_its_powers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        adversary = attack.context.adversary
        if record.round == 1 and record.phase == "upload" and adversary is not None:
            adversary.powers = frozenset(SERVER_POWERS)
            attack.outcome["answerer"] = adversary._line
            _tries(attack.outcome, "query", lambda: adversary.query(0, torch.zeros(1, *attack.view.image_shape)))

    cheater = _cheater(monkeypatch, cheat, frozenset({Capability.choose_public_batch}))
    _experiment(tmp_path).run()
    assert cheater.outcome == {"answerer": None, "query": StaleQueryError}


def test_writing_into_the_views_public_images_changes_nothing_the_clients_train_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FedGEMS withholds the power to change the public set: the view's images are the attacker's own copy."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        assert attack.view.public is not None
        attack.view.public.images.fill_(1.0)
        if attack.view.prior_data is not None:
            attack.view.prior_data.images.fill_(1.0)

    _cheater(monkeypatch, cheat, reads=frozenset({ViewPart.public, ViewPart.prior_data}))
    exp = _experiment(tmp_path, "protocol=fedgems")
    public = exp.protocol.split.public.images.clone()
    exp.run()
    assert torch.equal(exp.protocol.split.public.images, public)
    assert not torch.equal(public, torch.ones_like(public))


def test_a_result_holding_a_spy_or_of_a_result_subclass_never_meets_the_ground_truth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def result(attack: CheatingAttack) -> Reconstructions:
        targets = torch.tensor(attack.view.target_labels)
        return Reconstructions(spy((len(targets), *attack.view.image_shape)), targets)

    _cheater(monkeypatch, lambda attack, record: None, result=result)
    with pytest.raises(BoundaryError, match=r"attack cheat's Reconstructions.images must be a plain torch.Tensor"):
        _experiment(tmp_path, "protocol.rounds=1").run()
    assert Spy.seen == []

    class Sly(Reconstructions):
        pass

    _cheater(
        monkeypatch,
        lambda attack, record: None,
        result=lambda attack: Sly(
            torch.zeros(len(attack.view.target_labels), *attack.view.image_shape), torch.tensor(attack.view.target_labels)
        ),
    )
    with pytest.raises(BoundaryError, match="results must be exactly one of"):
        _experiment(tmp_path / "sly", "protocol.rounds=1").run()


def test_trained_networks_keep_no_gradient_of_their_last_private_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-model loop and vectorised path alike: what an attack could reach of a client network holds no ``.grad``."""
    for vectorise in ("false", "true"):
        _cheater(monkeypatch, lambda attack, record: None)
        exp = _experiment(tmp_path / vectorise, f"trainer.vectorise={vectorise}", "protocol.rounds=1")
        exp.run()
        assert all(p.grad is None for c in exp.protocol.clients for p in c.module.parameters()), vectorise


def test_each_attack_holds_only_the_view_parts_it_declares_and_no_two_attacks_share_an_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside a membership attack, another attack (PLI, say) would otherwise hold every client's private samples with
    their labels, the candidates; LDIA would hold the public set and the server's aggregation rule it never uses. And
    the attacks' public images would be one tensor, which one could write for all."""
    cheater = _cheater(monkeypatch, lambda attack, record: None)
    member = type("Member", (cheater,), {"reads": frozenset({ViewPart.candidates, ViewPart.public})})
    monkeypatch.setattr(ATTACKS, "_items", {**ATTACKS._items, "member": member})
    exp = _experiment(
        tmp_path,
        "attacks=[cheat,member,ldia]",
        "protocol.rounds=1",
        "data.split=classes",
        "data.public_classes=[5,6,7,8,9]",
        "data.partition=iid",
    )
    exp.run()
    cheat_view, member_view, ldia_view = (attack.view for attack in exp.attacks)
    assert exp.view.prior_data is not None and exp.view.aggregation is not None  # FedMD's server grants both
    undeclared = [
        cheat_view.candidates,
        cheat_view.prior_data,
        cheat_view.aggregation,
        ldia_view.public,
        ldia_view.candidates,
        ldia_view.prior_data,
        ldia_view.aggregation,
        member_view.prior_data,
    ]
    assert all(isinstance(part, Undeclared) for part in undeclared)
    for use in (lambda part: part.images, lambda part: len(part), lambda part: part[0], lambda part: bool(part)):
        for part in undeclared:
            with pytest.raises(UndeclaredPartError, match="without declaring it"):
                use(part)
    assert isinstance(member_view.candidates, ImageSet) and len(member_view.candidates) > 0
    assert cheat_view.public is not None and member_view.public is not None
    pointers = {v.public.images.untyped_storage().data_ptr() for v in (cheat_view, member_view, exp.view)}  # type: ignore[union-attr]
    assert len(pointers) == 3 and exp.protocol.split.public.images.untyped_storage().data_ptr() not in pointers


@pytest.mark.parametrize("protocol", ["dsfl", "fedmd"])
def test_queries_open_only_after_the_upload_and_at_the_attack_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    """A passive attack querying after DS-FL's distillation would read client states that never cross the wire."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        attack.outcome.setdefault(record.round, []).append((record.phase, record.attack_point, record.query is not None))  # type: ignore[union-attr]

    cheater = _cheater(monkeypatch, cheat)
    _experiment(tmp_path, f"protocol={protocol}", "protocol.rounds=1").run()
    phases = cheater.outcome[1]
    assert {phase for phase, _, _ in phases} > {"upload"} | {phase for phase, point, _ in phases if point}  # other phases ran
    assert [(phase, opened) for phase, point, opened in phases] == [(phase, phase == "upload" or point) for phase, point, _ in phases]


def test_the_attack_holds_no_run_seed_to_rebuild_the_runs_secrets_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the run seed, an attack would rebuild the membership candidates' order (which are whose, which are test
    samples: AUC 1) and the defenses' noise. It gets the attacker's seed, derived from it, and finds the run seed in
    no environment variable (Lightning's ``seed_everything`` writes ``PL_GLOBAL_SEED``) and not in ``torch.initial_seed()``."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        attack.outcome.update(seed=attack.context.seed, environment=dict(os.environ), initial=torch.initial_seed())

    cheater = _cheater(monkeypatch, cheat)
    member = type("Member", (cheater,), {"reads": frozenset({ViewPart.candidates})})
    monkeypatch.setattr(ATTACKS, "_items", {**ATTACKS._items, "cheat": member})
    exp = _experiment(tmp_path, "seed=1234", "protocol.rounds=1")
    exp.run()
    held = int(cheater.outcome["seed"])  # type: ignore[call-overload]
    assert held != 1234 and "1234" not in cheater.outcome["environment"].values()  # type: ignore[union-attr]
    assert cheater.outcome["initial"] != 1234
    real = membership_candidates(exp.cfg, exp.data, exp.assembly.declared)
    assert real is not None
    rebuilt = {seed: candidate_pool(exp.data.split, None, derive_seed(seed, "membership_candidates")).origin for seed in (1234, held)}
    assert torch.equal(rebuilt[1234], real.origin)  # the rebuilding works, given the run seed
    assert not torch.equal(rebuilt[held], real.origin)


def test_the_global_generators_an_attack_reads_give_back_no_run_seed_and_predict_no_defense_noise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review's attack (issue 47, item 1): read numpy's, Python's and torch's global generators while observing an
    upload, find the seed that set them, and with it regenerate the Laplace noise on a client's upload (drawn from the
    run seed, round, phase, client and rows) to take it off. The generators an attack reads are seeded per call from a
    seed derived one-way from the run seed, so no seed among the first 2,000 (1234, the run's, among them) sets them."""
    scale, seeds = 1000.0, range(2000)

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        if record.round != 1 or record.phase != "upload":
            return
        numpy_keys, python, state = np.random.get_state()[1], random.getstate(), torch.random.get_rng_state()
        attack.outcome["found"] = {
            s
            for s in seeds
            if np.array_equal(np.random.RandomState(s).get_state()[1], numpy_keys)
            or random.Random(s).getstate() == python
            or torch.equal(torch.Generator().manual_seed(s).get_state(), state)
        }
        attack.outcome["upload"] = record.uploads[0]

    cheater = _cheater(monkeypatch, cheat)
    _experiment(tmp_path, "seed=1234", "protocol.rounds=1", "defenses=[laplace]", f"defense.laplace.scale={scale}").run()
    upload = cheater.outcome["upload"]
    release = Release(0, 1, "upload", upload.kind, batch_key(upload.batch))  # type: ignore[union-attr]

    def residual(seed: int) -> float:
        """The largest logit left once the noise regenerated from ``seed`` is taken off the upload."""
        noise = laplace_noise(upload.outputs.shape, scale, release.generator(seed, "laplace"))  # type: ignore[union-attr]
        return float((upload.outputs - noise.float()).abs().max())  # type: ignore[union-attr]

    assert residual(1234) < 100 < residual(1235)  # the noise comes off, given the run seed (it is 1,000s, logits are 10s)
    assert cheater.outcome["found"] == set()


def test_an_attack_that_seeds_or_draws_from_the_global_generators_moves_none_of_the_protocols_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An honest attack that seeds torch for its own network (``torch.manual_seed``) or draws from the global generators
    while observing a record would otherwise move the protocol's own draws after it (here MID's bottleneck noise in
    FedMD's digest and revisit training), so that one simulation would differ with the attacks beside it."""

    def draw(attack: CheatingAttack, record: RoundRecord) -> None:
        torch.manual_seed(0)
        np.random.seed(0)
        random.seed(0)
        torch.rand(1000)

    metrics = {}
    for name, cheat in (("quiet", lambda attack, record: None), ("drawing", draw)):
        _cheater(monkeypatch, cheat)
        metrics[name] = _experiment(tmp_path / name, "protocol.rounds=1", "defenses=[mid]").run()
    protocol = [key for key in metrics["quiet"] if key.startswith(("protocol/", "defense/"))]
    assert "protocol/digest_loss" in protocol and "defense/mid/kl" in protocol
    assert {key: metrics["drawing"][key] for key in protocol} == {key: metrics["quiet"][key] for key in protocol}


def _tensors(record: RoundRecord) -> list[torch.Tensor]:
    """Copies of every tensor a record carries (the uploads' outputs, rows and answered masks, the batch, the aggregate,
    the server's outputs)."""
    found = [t for u in record.uploads.values() for t in (u.outputs, u.batch.rows if u.batch else None, u.answered)]
    found += [record.batch.rows if record.batch else None, record.aggregate, record.server_outputs]
    return [t.clone() for t in found if t is not None]


def test_an_attack_that_writes_into_its_record_changes_nothing_the_next_attack_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An honest attack that centres the uploads in place (or writes any tensor of its record) would otherwise change what
    every attack after it sees, without a word: each observer gets its own copy of the record."""

    def write(attack: CheatingAttack, record: RoundRecord) -> None:
        for upload in record.uploads.values():
            assert upload.outputs is not None and upload.batch is not None
            upload.outputs.sub_(upload.outputs.mean(dim=1, keepdim=True))
            upload.batch.rows.fill_(0)
        for tensor in (record.aggregate, record.server_outputs, None if record.batch is None else record.batch.rows):
            if tensor is not None:
                tensor.fill_(7)
        attack.outcome.setdefault("seen", []).append(_tensors(record))  # type: ignore[union-attr]

    def witness(name: str) -> type[CheatingAttack]:
        def keep(attack: CheatingAttack, record: RoundRecord) -> None:
            type(attack).outcome.setdefault("seen", []).append(_tensors(record))  # type: ignore[union-attr]

        cls = type(name.title(), (CheatingAttack,), {"name": name, "cheat": staticmethod(keep)})
        cls.outcome = {}
        return cls

    writer, first, last = _cheater(monkeypatch, write), witness("first"), witness("last")
    monkeypatch.setattr(ATTACKS, "_items", {**ATTACKS._items, "first": first, "last": last})
    _experiment(tmp_path, "attacks=[first,cheat,last]", "protocol.rounds=1").run()
    seen_first, seen_written, seen_last = first.outcome["seen"], writer.outcome["seen"], last.outcome["seen"]
    assert len(seen_first) == len(seen_written) == len(seen_last) >= 4  # type: ignore[arg-type]
    pairs = [(a, b) for before, written in zip(seen_first, seen_written) for a, b in zip(before, written)]  # type: ignore[call-overload]
    assert pairs and not all(torch.equal(a, b) for a, b in pairs)  # the writer did change its own copy
    for before, after in zip(seen_first, seen_last):  # type: ignore[call-overload]
        assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))


class SideEffectStr(str):
    """A ``str`` whose ``==`` runs the attack's code (here it notes what it was compared with)."""

    ran: list[object] = []

    def __eq__(self, other: object) -> bool:
        SideEffectStr.ran.append(other)
        return str.__eq__(self, other)

    __hash__ = str.__hash__


class ArrayLike:
    """An object NumPy and torch turn into an array through ``__array__``, which runs the attack's code."""

    ran: list[object] = []

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        ArrayLike.ran.append(dtype)
        return self.array


class ArrayRows(list):
    """A list of rows whose ``__array__`` runs the attack's code."""

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        ArrayLike.ran.append(dtype)
        return np.asarray(list(self))


@pytest.mark.parametrize(("field", "refused"), [("role", "SideEffectStr"), ("images", "ArrayLike")])
def test_a_result_field_that_is_not_plain_data_is_refused_by_its_type_before_any_of_its_code_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, refused: str
) -> None:
    """A ``str`` subclass in ``role`` would run its ``__eq__`` inside the scorer, beside the private class means; an
    object with ``__array__`` in ``images`` would run it there too. Results are rebuilt field by field by exact type."""

    def result(attack: CheatingAttack) -> Reconstructions:
        targets = torch.tensor(attack.view.target_labels)
        images = torch.zeros(len(targets), *attack.view.image_shape)
        hostile = {"role": SideEffectStr("attack")} if field == "role" else {"images": ArrayLike(images.numpy())}
        return Reconstructions(**{"images": images, "labels": targets, **hostile})  # type: ignore[arg-type]

    SideEffectStr.ran, ArrayLike.ran = [], []
    _cheater(monkeypatch, lambda attack, record: None, result=result)
    with pytest.raises(
        BoundaryError, match=rf"^attack cheat's Reconstructions\.{field} must be a plain .* not (tests\.)?test_cheating_attacks\.{refused}$"
    ):
        _experiment(tmp_path, "protocol.rounds=1").run()
    assert SideEffectStr.ran == [] and ArrayLike.ran == []


def test_query_rows_that_are_not_plain_numbers_are_refused_before_any_of_their_code_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows a query or the adversary is handed become a tensor without NumPy's ``__array__`` protocol, which would run the
    attack's code on the protocol side: a list subclass, an array-like object, an array-like inside a list."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        adversary, out = attack.context.adversary, attack.outcome
        if record.query is None or adversary is None:
            return
        for key, rows in (
            ("array-like", ArrayLike(np.arange(3))),
            ("list subclass", ArrayRows([0, 1, 2])),
            ("inside a list", [ArrayLike(np.arange(3))]),
        ):
            _tries(out, key, lambda rows=rows: record.query(0, rows))  # type: ignore[misc]
            _tries(out, f"{key} (chosen rows)", lambda rows=rows: adversary.choose_public_rows(rows))
        _tries(out, "plain", lambda: record.query(0, [0, 1, 2]))

    ArrayLike.ran = []
    cheater = _cheater(monkeypatch, cheat, frozenset({Capability.choose_public_batch}))
    _experiment(tmp_path, "protocol.rounds=1").run()
    assert cheater.outcome.pop("plain") == "accepted"
    assert cheater.outcome == {key: BoundaryError for key in cheater.outcome} and len(cheater.outcome) == 6, cheater.outcome
    assert ArrayLike.ran == []


def test_no_object_an_attack_holds_leads_to_a_network_even_while_its_phase_is_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The answerer behind a query (live networks, upload defenses, the evasive clients' digests) stays protocol-side:
    the query handle and the adversary hold its token, which answers nothing once the phase closes."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        if record.query is not None:
            attack.outcome.setdefault("walks", []).append(list(reachable(attack, record)))  # type: ignore[union-attr]
            attack.outcome["kept"] = (record.query, attack.context.adversary)

    cheater = _cheater(monkeypatch, cheat, frozenset({Capability.query_chosen_batch}))
    exp = _experiment(tmp_path, "protocol.rounds=1", "protocol.evasive_clients=[0]")
    exp.run()
    walks = cheater.outcome["walks"]
    assert walks and not [o for walk in walks for o in walk if isinstance(o, torch.nn.Module)]  # type: ignore[union-attr]
    query, adversary = cheater.outcome["kept"]  # type: ignore[misc]
    with pytest.raises(StaleQueryError):
        query(0, torch.arange(2))
    with pytest.raises(StaleQueryError):
        adversary.query(0, torch.zeros(1, *exp.view.image_shape))


def test_fedavgs_participating_client_sees_the_global_model_and_no_ones_upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A participant receives the aggregate; every client's weights and private-set size went to the server only."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        attack.outcome.setdefault("uploads", []).append(dict(record.uploads))  # type: ignore[union-attr]
        attack.outcome["global"] = attack.outcome.get("global") or record.global_state is not None

    cheater = _cheater(monkeypatch, cheat, queries=False)
    Experiment(
        compose(
            REPO / "conf" / "experiment" / "fedavg_digits.yaml",
            tiny(tmp_path, "attacks=[cheat]", "protocol.rounds=1", "evaluation.classifier=null"),
        )
    ).run()
    assert cheater.outcome["global"] is True
    assert cheater.outcome["uploads"] and not any(cheater.outcome["uploads"])  # type: ignore[union-attr]


@pytest.mark.parametrize(("protocol", "labels_known"), [("dsfl", False), ("cronus", False), ("fedmd", True)])
def test_the_prior_data_brings_no_public_label_the_threat_model_withholds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str, labels_known: bool
) -> None:
    """With data.split=classes the prior data is the labelled public set: DS-FL's and Cronus's server, which does not
    know the public labels, gets no prior; FedMD's, which knows them, keeps it."""
    _cheater(monkeypatch, lambda attack, record: None, reads=frozenset({ViewPart.public, ViewPart.prior_data}))
    exp = _experiment(
        tmp_path, f"protocol={protocol}", "data.split=classes", "data.public_classes=[5,6,7,8,9]", "data.partition=iid", "protocol.rounds=1"
    )
    view = exp.attacks[0].view
    assert view.public is not None and bool((view.public.labels >= 0).any()) == labels_known
    assert (view.prior_data is not None) == labels_known


def test_the_attack_state_store_holds_no_path_to_the_run_directory_and_its_keys_cannot_climb_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacks' state folder sits inside the run directory, beside ``partition.json`` (membership and label
    truth), the checkpoints and the evaluation classifier: a path to it would reach them by ``..``. The store keeps its
    folder behind a token; nothing an attack holds names the run directory, and a key that climbs is refused."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        store = attack.context.store
        attack.outcome["names"] = [o for o in reachable(attack, record, atoms=True) if isinstance(o, (str, bytes, os.PathLike))]
        for key in ("../../partition", "../cheat/x", "/etc/passwd", ".hidden", "a//b", "a/../b"):
            _tries(attack.outcome, key, lambda key=key: store.load_artifact(key))
            _tries(attack.outcome, key + " (saved)", lambda key=key: store.save_artifact(key, torch.ones(1)))
        store.save_artifact("kept/state", {"w": torch.arange(3)})
        attack.outcome["read back"] = store.load_artifact("kept/state")

    cheater = _cheater(monkeypatch, cheat)
    exp = _experiment(tmp_path, "protocol.rounds=1")
    exp.run()
    run_dir = str(exp.output_dir.resolve())
    assert not [name for name in cheater.outcome["names"] if run_dir in os.fsdecode(name) or isinstance(name, os.PathLike)]  # type: ignore[union-attr]
    assert (exp.output_dir / "partition.json").is_file()
    refused = {k: v for k, v in cheater.outcome.items() if k not in ("names", "read back")}
    assert len(refused) == 12 and set(refused.values()) == {ValueError}, refused
    assert torch.equal(cheater.outcome["read back"]["w"], torch.arange(3))  # type: ignore[index]
    assert (exp.output_dir / "attack_state" / "cheat" / "kept" / "state.pt").is_file()


GAUNTLET = {  # protocol: its experiment (None: the embedded default) and what is switched on
    "fedmd": (None, ("defenses=[laplace]", "protocol.evasive_clients=[0]")),
    "dsfl": (None, ("protocol=dsfl", "defenses=[laplace]", "protocol.evasive_clients=[0]")),
    "labelavg": (None, ("protocol=labelavg", "protocol.evasive_clients=[0]")),
    "fedavg": ("fedavg_digits", ("defenses=[dpsgd]", "protocol.num_clients=3", "protocol.fraction=1.0")),
}


@pytest.mark.parametrize("protocol", list(GAUNTLET))
def test_every_passive_cheat_at_once_gains_nothing_under_each_protocol_with_defenses_and_evasive_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """One attack tries, on every record of a run: walking to anything private (a network, a private image, the split,
    the oracle, a gradient, the run seed, a path to the run directory); handing a query a tensor subclass; keeping a
    query past its phase; writing into the public images; reading a view part it did not declare."""
    from tests.test_threat_model import RUN_SEED, _assert_nothing_private

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        out = attack.outcome
        held = list(reachable(attack, record, atoms=True))
        out.setdefault("walks", []).append(held)  # type: ignore[union-attr]
        if record.query is not None:
            _tries(out, "spy query", lambda: record.query(0, torch.arange(2).as_subclass(Spy)))  # type: ignore[misc]
            out["kept query"] = record.query
        if attack.view.public is not None:
            attack.view.public.images.add_(1.0)
        _tries(out, "prior", lambda: attack.view.prior_data.images)
        _tries(out, "candidates", lambda: len(attack.view.candidates))

    cheater = _cheater(monkeypatch, cheat, queries=protocol != "fedavg")
    experiment, switched_on = GAUNTLET[protocol]
    exp = Experiment(
        compose(
            None if experiment is None else REPO / "conf" / "experiment" / f"{experiment}.yaml",
            tiny(
                tmp_path,
                "attacks=[cheat]",
                "evaluation.confidence_gap.enabled=false",
                "evaluation.classifier=null",
                "protocol.rounds=1",
                f"seed={RUN_SEED}",
                *switched_on,
            ),
        )
    )
    public = None if exp.protocol.split.public is None else exp.protocol.split.public.images.clone()
    exp.run()
    out, run_dir = cheater.outcome, str(exp.output_dir.resolve())
    walks = out.pop("walks")
    assert walks  # type: ignore[arg-type]
    for held in walks:  # type: ignore[union-attr]
        _assert_nothing_private(held, exp.data.split, exp.engine)
        assert not [o for o in held if isinstance(o, torch.nn.Module) or (torch.is_tensor(o) and o.grad is not None)]
        assert RUN_SEED not in [o for o in held if type(o) is int]
        assert not [o for o in held if isinstance(o, os.PathLike) or (isinstance(o, str) and run_dir in o)]
    assert out.pop("prior") is UndeclaredPartError and out.pop("candidates") is UndeclaredPartError
    if protocol == "fedavg":  # no public query: a participant gets the global model
        assert "kept query" not in out
    else:
        assert out.pop("spy query") is BoundaryError
        with pytest.raises(StaleQueryError):
            out.pop("kept query")(0, torch.arange(2))  # type: ignore[operator]
    assert not out, out
    if public is not None:
        assert torch.equal(exp.protocol.split.public.images, public)


def _held_objects(query: object) -> list[object]:
    """What an attack reaches from its query by ``vars``/``__dict__``/slots, ``__closure__``, ``__self__`` and
    containers, plus whatever the old module table answered for any ``_token`` it finds."""
    import fdattack.fd.answering as answering

    found = list(reachable(query))
    lookup = getattr(answering, "lookup", None)
    for obj in list(found):
        token = getattr(obj, "_token", None)
        if lookup is not None and token is not None:
            found.extend(reachable(lookup(token)))
    for name in dir(query):
        member = getattr(query, name, None)
        found.extend(reachable(getattr(member, "__self__", None), getattr(member, "__closure__", None)))
    return found


def test_a_query_leads_by_no_import_or_attribute_walk_to_a_network_a_defense_seed_or_the_public_tensor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: the attack imports ``fdattack.fd.answering``, looks up its query's token and walks what its query and
    adversary expose; none of the clients' networks, the Laplace defense (with its seed) or the protocol's public
    tensor is among what it finds (identity checks against the experiment's own objects)."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        if record.query is not None:
            attack.outcome.setdefault("found", []).extend(_held_objects(record.query) + _held_objects(attack.context.adversary))  # type: ignore[union-attr]

    cheater = _cheater(monkeypatch, cheat, frozenset({Capability.query_chosen_batch}))
    exp = _experiment(tmp_path, "protocol.rounds=1", "protocol.evasive_clients=[0]", "defenses=[laplace]")
    exp.run()
    found = {id(o) for o in cheater.outcome["found"]}  # type: ignore[union-attr]
    secrets_ = [*(c.module.net for c in exp.protocol.clients), *exp.protocol.upload_defenses, exp.protocol.split.public.images]
    assert found and exp.protocol.upload_defenses and not [s for s in secrets_ if id(s) in found]


def test_replacing_close_or_open_phase_keeps_no_query_answering_and_hands_over_no_answerer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: on DS-FL the attack replaces ``close`` on its query and ``open_phase``/``close_phase`` on its adversary
    with its own functions; the protocol calls none of them, and the kept query and adversary refuse after the phase."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        adversary, out = attack.context.adversary, attack.outcome
        if record.query is None or adversary is None:
            return

        def grab(*args: object, **kwargs: object) -> None:
            out.setdefault("handed", []).append(args)  # type: ignore[union-attr]

        for obj, name in ((record.query, "close"), (adversary, "open_phase"), (adversary, "close_phase")):
            setattr(obj, name, grab)
        out["kept"] = (record.query, adversary, record.query.rows[:2])

    cheater = _cheater(monkeypatch, cheat, frozenset({Capability.query_chosen_batch}))
    exp = _experiment(tmp_path, "protocol=dsfl", "protocol.rounds=1")
    exp.run()
    query, adversary, rows = cheater.outcome["kept"]  # type: ignore[misc]
    assert "handed" not in cheater.outcome
    with pytest.raises(StaleQueryError, match="after that phase ended"):
        query(0, rows)
    with pytest.raises(StaleQueryError, match="only while a phase is open"):
        adversary.query(0, torch.zeros(1, *exp.view.image_shape))


def test_a_query_whose_grant_is_widened_still_answers_only_the_granted_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 47: on DS-FL (the round's rows only) the attack widens ``_granted``, ``rows`` and ``clients`` on its query
    and sets an ``_open`` flag; asking for an ungranted row is refused on the protocol's side with one line naming the
    attack, and no answer comes back."""

    def cheat(attack: CheatingAttack, record: RoundRecord) -> None:
        query, out = record.query, attack.outcome
        if query is None or record.round != 1:
            return
        outside = next(r for r in range(len(attack.view.public)) if r not in set(query.rows.tolist()))
        query._granted = torch.ones(len(attack.view.public), dtype=torch.bool)  # type: ignore[attr-defined]
        query.rows = torch.arange(len(attack.view.public))
        query.clients = (0, 1, 2, 3)
        query._open = True  # type: ignore[attr-defined]
        try:
            out["answer"] = query(0, torch.tensor([outside]))
        except QueryRefusedError as err:
            out["refusal"] = str(err)
        out["granted"] = query(0, record.batch.rows[:2])  # type: ignore[union-attr]

    cheater = _cheater(monkeypatch, cheat)
    _experiment(tmp_path, "protocol=dsfl", "protocol.rounds=1", "protocol.public_per_round=64").run()
    refusal = cheater.outcome["refusal"]
    assert "answer" not in cheater.outcome and "\n" not in refusal  # type: ignore[operator]
    assert "attack cheat" in refusal and "outside the" in refusal, refusal  # type: ignore[operator]
    assert cheater.outcome["granted"].shape[0] == 2  # type: ignore[union-attr]
