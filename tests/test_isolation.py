"""Attacks in worker processes of their own (``isolation.mode=process``, issue 47).

An isolated run gives exactly the in-process results and resumes alike; hostile attacks that reach the run in process
(hooks, a ``TorchFunctionMode``, ``gc``, frames, descriptors, argv, the parent's ``/proc``, the run directory's files)
find nothing of it isolated; a worker that fails, sends what is not plain data, or goes past its wall seconds or memory
is stopped with one line while the run goes on; and what a worker sends is read without unpickling it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fdattack import assembly, experiment
from fdattack.cli import main
from fdattack.errors import WorkerError
from fdattack.isolation import Zygote, codec, seccomp, worker_devices
from fdattack.isolation.framing import MessageError, MessageReader, read_message
from fdattack.isolation.processes import log_of
from fdattack.isolation.sandbox import landlock_abi
from fdattack.randomness import derive_seed
from tests.conftest import REPO
from tests.test_threat_model import SMALL as SMALL_ATTACKS

#: a two-client run of the digits with small attacks (test_threat_model's): seconds a round
SMALL = [
    "protocol.num_clients=2",
    "protocol.transfer_public_epochs=1",
    "protocol.transfer_private_epochs=1",
    "logger.wandb.mode=disabled",
    "logger.progress=never",
    "data.max_per_class=30",
    *SMALL_ATTACKS,
]
HOSTILE = [
    "hostile_globals",
    "hostile_walk",
    "hostile_hooks",
    "hostile_proc",
    "hostile_stale",
    "hostile_declarations",
    "hostile_search",
    "hostile_escape",
]
#: attacks the isolated run stops, each with why: a result that is not plain data, past isolation.seconds, past
#: isolation.memory_mb, a forged failure line, a tensor header of 2^64 elements, a length with no body (which keeps no
#: other worker waiting), a 16 GiB length, a result type it does not declare
STOPPED = {
    "hostile_result": ("failed", "BoundaryError"),
    "slow_attack": ("seconds", "isolation.seconds=10"),
    "hungry_attack": ("memory", "isolation.memory_mb=1500"),
    "hostile_failure": ("failed", "ok\\nattack ldia stopped: forged"),  # its forged line stays inside its own, escaped
    "hostile_shape": ("failed", "not plain data (a tensor field of no known dtype or shape)"),
    "hostile_silence": ("seconds", "isolation.seconds=10"),
    "hostile_huge": ("failed", f"a message of {1 << 34} bytes, over the limit of {1500 << 20}"),
    "hostile_undeclared": ("failed", "could not be scored (RuntimeError: attack hostile_undeclared returned LabelDistributions but"),
}


def _rows(out: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in (out / "rounds.jsonl").read_text().splitlines()
    ]


def _metrics(out: Path) -> dict:
    return {k: v for k, v in json.loads((out / "metrics.json").read_text()).items() if not k.startswith("time/")}


def _run_process(cwd: Path, out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``fdattack run`` in a process of its own, in ``cwd``, with the hostile attacks importable as a plugin."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "fdattack", "run", *SMALL, "plugins=[tests.hostile_attacks]", f"output_dir={out}", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


# ---------------------------------------------------------------------------------------------------------- the codec
def test_plain_data_round_trips_through_the_codec() -> None:
    tensors = [torch.arange(6, dtype=d).reshape(2, 3) for d in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)]
    tensors += [torch.randn(2, 3, dtype=d) for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]
    tensors += [torch.tensor([True, False]), torch.empty(0, 4), torch.tensor(3.5), torch.randn(4, 4).t()]
    value = [
        "results",
        {"a": tensors, "big": 2**70, "neg": -3, "f": 0.1, "inf": math.inf, "ninf": -math.inf},
        (1, "x", None, True),
        b"\x00\xff",
    ]
    back = codec.decode(codec.encode(value))
    assert back[0] == "results" and back[2] == (1, "x", None, True) and back[3] == b"\x00\xff"
    assert back[1]["big"] == 2**70 and back[1]["neg"] == -3 and back[1]["f"] == 0.1 and back[1]["inf"] == math.inf
    assert back[1]["ninf"] == -math.inf
    for sent, got in zip(tensors, back[1]["a"]):
        assert type(got) is torch.Tensor and got.dtype == sent.dtype and got.shape == sent.shape and torch.equal(got, sent)
    assert math.isnan(codec.decode(codec.encode([math.nan]))[0])


class Sneaky(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        Sneaky("x"),
        np.zeros(3),
        object(),
        {1: "a"},
        torch.zeros(2).as_subclass(type("T", (torch.Tensor,), {})),
        torch.zeros(2, dtype=torch.complex64),
    ],
    ids=["str-subclass", "ndarray", "object", "int-keyed-dict", "tensor-subclass", "complex"],
)
def test_the_codec_refuses_to_encode_what_is_not_plain_data(value: object) -> None:
    with pytest.raises(codec.CodecError):
        codec.encode([value])


@pytest.mark.parametrize(
    "message",
    [
        b"\x80\x04\x95",  # a pickle
        codec.encode([1])[:-1],  # cut short
        codec.encode([torch.zeros(3)]) + b"\x00",  # a byte no field accounts for
        (lambda h: len(h).to_bytes(8, "little") + h)(b'{"t":"float32","s":[4],"n":4}') + b"\x00" * 4,  # bytes that do not fit the shape
        (lambda h: len(h).to_bytes(8, "little") + h)(b'{"t":"object","s":[1],"n":8}') + b"\x00" * 8,  # no such dtype
        (lambda h: len(h).to_bytes(8, "little") + h)(b'{"py/object":"os.system"}'),  # a node of no known kind
        (lambda h: len(h).to_bytes(8, "little") + h)(b"3"),  # a bare JSON number (ints travel as strings)
        (lambda h: len(h).to_bytes(8, "little") + h)(b'{"t":"float32","s":[0,18446744073709551616],"n":0}'),  # 2^64 rows of nothing
    ],
    ids=["pickle", "short", "trailing", "misfit", "dtype", "unknown-node", "bare-number", "absurd-shape"],
)
def test_the_codec_refuses_crafted_messages(message: bytes) -> None:
    with pytest.raises(codec.CodecError):
        codec.decode(message)


# ------------------------------------------------------------------------------------------------ results and resume
@pytest.mark.slow
def test_the_run_reads_a_worker_s_messages_without_waiting_and_refuses_lengths_over_its_limit() -> None:
    """A message that arrives in pieces is returned whole once its last byte is in, never before; a length with no body
    gives None at once (the run goes on with its other workers) and says since when it was begun; a length over the
    limit is refused before its body is read; a closed channel is EOFError."""
    ours, theirs = socket.socketpair()
    reader = MessageReader(ours.fileno(), limit=1000)
    body = codec.encode(["results", [torch.arange(6.0)]])
    framed = len(body).to_bytes(4, "big") + body
    theirs.sendall(framed[:3])
    assert reader.read() is None and reader.begun is not None and reader.size is None
    theirs.sendall(framed[3:10])
    assert reader.read() is None and reader.size == len(body)
    theirs.sendall(framed[10:] + (0).to_bytes(4, "big"))
    kind, (tensor,) = codec.decode(reader.read())
    assert kind == "results" and torch.equal(tensor, torch.arange(6.0))
    assert reader.read() == bytearray() and reader.begun is None
    theirs.sendall((1000).to_bytes(4, "big"))  # a length and never its body: nothing waits for it
    assert reader.read() is None and reader.size == 1000
    with pytest.raises(TimeoutError):
        read_message(reader, time.monotonic() + 0.3)
    huge = MessageReader(theirs.fileno(), limit=1000)
    ours.sendall((-1).to_bytes(4, "big", signed=True) + (1 << 34).to_bytes(8, "big"))
    with pytest.raises(MessageError, match=f"a message of {1 << 34} bytes, over the limit of 1000"):
        huge.read()
    ours.close()
    with pytest.raises(EOFError):
        huge.read()


def test_isolated_attacks_give_the_in_process_results_and_resume_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same run in process and isolated with overlapping round ends: every metric of every round equal (the workers
    draw from the streams the run would have given each call, in the order it would have called them); the isolated
    run resumed from the checkpoint it wrote while its workers ended the round ends equal too, overlapping or not
    (``isolation.overlap`` decides no result; with ``attack_seed`` given, ``isolation.mode`` changes none, but an isolated
    run is never resumed in process).
    Isolated without overlap, the hostile runs below check LDIA's metrics against the in-process run's.

    DS-FL's clients train before they upload, so LDIA's round end overlaps that training; PLI and TBI, whose records
    carry a query, catch up at the upload."""
    dsfl = [key for key in SMALL if not key.startswith("protocol.transfer_")]  # FedMD's set-up keys
    args = ["run", *dsfl, "protocol=dsfl", "attacks=[pli,tbi,ldia]", "protocol.rounds=2", "keep_checkpoints=2", "attack_seed=42"]
    in_process, isolated = tmp_path / "in_process", tmp_path / "isolated"
    assert main([*args, f"output_dir={in_process}"]) == 0
    overlap = [f"output_dir={isolated}", "isolation.mode=process", "isolation.overlap=true"]
    for module in (assembly, experiment):  # cores for all three beside the run's, anywhere
        monkeypatch.setattr(module, "concurrent_workers", lambda threads: 4)
    assert main([*args, *overlap]) == 0
    assert _rows(isolated) == _rows(in_process) and _metrics(isolated) == _metrics(in_process)
    assert {p.name for p in (isolated / "attack_state").iterdir()} >= {"pli", "tbi", "ldia"}
    # LDIA's round end ran beside the whole next round (no query to wait at); the last round had nothing beside it
    beside = [json.loads(line)["time/ldia/overlap_s"] for line in (isolated / "rounds.jsonl").read_text().splitlines()[1:]]
    assert beside[0] > 3 * beside[1], beside  # 5x on a Xeon loaded by two matrix workers beside a niced suite, 10x+ idle

    (isolated / "checkpoints" / "round_0002.pt").unlink()
    assert main([*args, *overlap, "resume=true"]) == 0
    assert _rows(isolated) == _rows(in_process) and _metrics(isolated) == _metrics(in_process)

    (isolated / "checkpoints" / "round_0002.pt").unlink()
    assert main([*args, f"output_dir={isolated}", "isolation.mode=process", "resume=true"]) == 0  # resumed without overlap
    assert _rows(isolated) == _rows(in_process) and _metrics(isolated) == _metrics(in_process)
    # an isolated result is never continued in process, where an attack could read the run
    assert main([*args, f"output_dir={isolated}", "resume=true"]) == 2


# ------------------------------------------------------------------------------------------------ hostile attacks
@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """One round of FedMD with the hostile attacks and LDIA, in process and isolated (with the dishonest, slow and
    hungry attacks, each over its budget, beside them); each mode's folder and finished process."""
    root = tmp_path_factory.mktemp("hostile")
    common = ["protocol.rounds=1", "protocol.name=fedmd"]
    runs = {
        "in_process": [f"attacks=[{','.join([*HOSTILE, 'ldia'])}]", "isolation.mode=in_process"],
        "process": [
            f"attacks=[{','.join([*HOSTILE, *STOPPED, 'hostile_mutation', 'ldia'])}]",
            "isolation.mode=process",
            "isolation.seconds=10",
            "isolation.memory_mb=1500",
        ],
    }
    done = {}
    for mode, overrides in runs.items():
        folder = root / mode
        done[mode] = (folder, _run_process(folder, folder / "run", *common, *overrides))
        stopped = 3 if mode == "process" else 0  # isolated, the STOPPED attacks are stopped: the run says so in its exit status
        assert done[mode][1].returncode == stopped, done[mode][1].stderr[-2000:]
    return done


def _found(runs: dict[str, tuple[Path, subprocess.CompletedProcess]], mode: str) -> dict[str, dict]:
    folder = runs[mode][0]
    states = folder / "run" / "attack_state"
    return {
        name: json.loads((folder / f"found_{name}.json" if mode == "in_process" else states / name / f"found_{name}.json").read_text())
        for name in HOSTILE
    }


@pytest.mark.slow
def test_hostile_attacks_reach_the_run_in_process_and_find_nothing_of_it_isolated(hostile_runs: dict) -> None:
    """The same five hostile attacks (tests/hostile_attacks.py), in process and isolated.

    In process (the paths docs/threat-model.md lists as needing isolation) the hooks count the clients' forward passes,
    the walks meet the run's objects and networks, and the descriptors and argv lead to the run directory; isolated each
    finds nothing, its parent's command line and the run's partition.json stay unreadable (Landlock), and in both modes
    the global generators hold no run seed and a kept query handle answers nothing after its phase."""
    inside, isolated = _found(hostile_runs, "in_process"), _found(hostile_runs, "process")
    assert inside["hostile_hooks"]["forwards_seen"] > 0 and inside["hostile_hooks"]["images_seen"] > 0
    assert inside["hostile_hooks"]["functions_seen"] > 0
    assert inside["hostile_walk"]["run_objects"] > 0 and inside["hostile_walk"]["frames_with_run_objects"] > 0
    assert inside["hostile_walk"]["networks"] > 0
    assert inside["hostile_proc"]["argv_secrets"] > 0 and inside["hostile_proc"]["lock_or_run_files"] > 0

    assert inside["hostile_declarations"]["required_saw_rows"] > 0 and inside["hostile_declarations"]["rows_here"] > 0
    # isolated, its declarations are read in a confined child of the zygote and its settings made in its worker: the
    # run calls none of its code, and what its settings' making or its declarations saw was nothing
    assert isolated["hostile_declarations"] == {"required_saw_rows": 0, "settings_saw_rows": 0, "rows_in_settings": 0, "rows_here": 0}
    # in process each call's streams derive from the run seed, and a search finds it; isolated, from a secret of the run's
    assert inside["hostile_search"] == {"run_seed_found": 42} and isolated["hostile_search"] == {"run_seed_found": -1}
    escapes = ("fork", "program", "udp", "unix_socket", "shared_memory", "memfd")
    assert inside["hostile_escape"] == {what: "done" for what in escapes}
    if seccomp.filter_supported():  # no process, program, socket or memfd; and (Landlock) no file in /dev/shm
        shm = "PermissionError" if landlock_abi() else "done"
        assert isolated["hostile_escape"] == {**{what: "PermissionError" for what in escapes}, "shared_memory": shm}
    assert isolated["hostile_hooks"] == {"forwards_seen": 0, "images_seen": 0, "functions_seen": 0}
    assert isolated["hostile_walk"] == {"run_objects": 0, "networks": 0, "frames_with_run_objects": 0, "answering_threads": 0}
    proc = isolated["hostile_proc"]
    assert proc["argv_secrets"] == 0 and proc["lock_or_run_files"] == 0 and proc["environment_secrets"] == 0
    if landlock_abi():
        assert proc["parent_cmdline"] == 0 and proc["partition"] == 0
    run_seed_words = np.random.RandomState(42).get_state()[1][:2].tolist()
    for seen in (inside, isolated):
        assert seen["hostile_stale"] == {"stale_answered": 0, "refusal": "StaleQueryError"}
        assert seen["hostile_globals"]["torch_initial_seed"] not in (42, derive_seed(42, "globals"))
        assert seen["hostile_globals"]["numpy_words"] != run_seed_words


@pytest.mark.slow
def test_a_dishonest_failing_slow_or_hungry_worker_is_stopped_and_the_run_goes_on(hostile_runs: dict) -> None:
    """Isolated: a result whose ``role`` is a ``str`` subclass is refused in the worker, which stops; workers past
    ``isolation.seconds`` or ``isolation.memory_mb`` are stopped; each with one line; and LDIA beside them, and beside
    an attack that zeroes every tensor of its records in place, scores as LDIA in process."""
    folder, done = hostile_runs["process"]
    metrics = _metrics(folder / "run")
    for name, (why, line) in STOPPED.items():
        assert metrics[f"attack/{name}/stopped/{why}"] == 1.0, name
        assert not any(key.startswith(f"attack/{name}/") and "stopped" not in key for key in metrics), name
        lines = [text for text in done.stderr.splitlines() if f"attack {name} stopped" in text]
        assert len(lines) == 1 and line in lines[0], (name, done.stderr[-3000:])
    forged = [line for line in done.stderr.splitlines() if "attack ldia stopped" in line and "attack hostile_failure stopped" not in line]
    assert forged == []
    assert max(len(line) for line in done.stderr.splitlines() if "attack hostile_failure stopped" in line) < 600
    in_process = _metrics(hostile_runs["in_process"][0] / "run")
    ldia = {k: v for k, v in in_process.items() if k.startswith("attack/ldia/")}
    assert ldia and {k: metrics[k] for k in ldia} == ldia


@pytest.mark.parametrize(
    ("run_device", "gpus", "workers", "expected"),
    [
        pytest.param("cpu", 0, 2, [("cpu", 1)] * 2, id="cpu"),
        pytest.param("cuda:0", 1, 3, [("cuda", [0])] * 3, id="one_gpu_shared"),
        pytest.param("cuda:0", 4, 5, [("cuda", [g]) for g in (1, 2, 3, 1, 2)], id="four_gpus"),
        pytest.param("cuda:2", 3, 3, [("cuda", [g]) for g in (0, 1, 0)], id="run_on_the_third"),
    ],
)
def test_each_worker_takes_a_gpu_the_run_does_not_simulate_on(run_device: str, gpus: int, workers: int, expected: list) -> None:
    assert worker_devices(run_device, gpus, workers) == expected


def test_the_run_opens_no_worker_log_through_a_link_and_none_in_a_worker_s_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 56's escape on resume: a worker replaced its ``worker.log`` with a link into ``site-packages`` and the
    run, reopening it, wrote the worker's output there. The log now lies beside the worker's folder, where no worker
    writes, and a link planted at it is refused before anything is written through it."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    victim = tmp_path / "site-packages" / "evil.pth"
    victim.parent.mkdir()
    victim.write_text("kept\n")
    zygote, worker = Zygote(), tmp_path / "attack_state" / "ldia"
    worker.mkdir(parents=True)
    (tmp_path / "attack_state" / "ldia.log").symlink_to(victim)
    try:
        with pytest.raises(WorkerError, match="cannot open the worker log .*ldia.log: a symbolic link there is refused"):
            zygote.fork(worker, log_of(worker))
    finally:
        zygote.close()
    assert victim.read_text() == "kept\n"
    assert log_of(worker) == tmp_path / "attack_state" / "ldia.log" and worker not in log_of(worker).parents


def test_workers_that_cannot_start_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zygote whose interpreter exits at once (here ``/bin/false``) is a :class:`WorkerError` naming the way out."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    zygote = Zygote()
    try:
        with pytest.raises(WorkerError, match="did not start or answer.*isolation.mode=in_process"):
            zygote.fork(tmp_path / "worker", tmp_path / "worker.log")
    finally:
        zygote.close()
    assert not zygote.folder.exists()
