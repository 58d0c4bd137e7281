"""Command line: ``fdattack run [EXPERIMENT.yaml] [key=value ...]``.

The entry point only parses tokens, composes the config and calls :func:`fdattack.experiment.run`.
A :class:`~fdattack.errors.FdattackError` becomes one line on stderr and exit status 2; a full disk one line and exit
status 1; SIGTERM one line (a run records it in ``exit.json``) and exit status 143, Ctrl-C 130 (``fdattack matrix``: one
line saying how many simulations finished, :mod:`fdattack.matrix.stopping`).
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import threading
from pathlib import Path
from typing import Sequence

from fdattack import __version__
from fdattack.errors import FdattackError, Terminated, forget_terminated, raise_terminated
from fdattack.matrix.stopping import MatrixStopped

#: Errors of the machine, not of fdattack or its input: one line and exit status 1 (nothing recorded is lost).
#: the exit status of a run that finished with an attack stopped (its worker failed, or overran its budget)
STOPPED_ATTACKS_STATUS = 3
DISK_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fdattack", description="Privacy attacks against federated distillation, round by round.")
    parser.add_argument("--version", action="version", version=f"fdattack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run one experiment",
        description="Run one experiment. Tokens are an optional experiment (a YAML's path, or the name of one in "
        "conf/experiment/, e.g. pli_fedmd_digits), then key=value overrides (OmegaConf dotlist, e.g. protocol.num_clients=10) "
        "or group=name (loads conf/<group>/<name>.yaml). Names are looked up in ./conf, then in fdattack's own.",
    )
    run.add_argument("tokens", nargs="*", metavar="[EXPERIMENT] key=value", help="experiment file or name, and overrides")
    run.add_argument("--help-config", action="store_true", help="print every config key with its default and meaning")
    run.add_argument("--print-config", action="store_true", help="print the composed config and exit")
    report = sub.add_parser("report", help="write a static HTML page of run directories (the offline dashboard)")
    report.add_argument("runs", nargs="+", help="run directories")
    report.add_argument("--out", required=True, help="folder for index.html and its plots")
    sweep = sub.add_parser("sweep", help="run a W&B sweep file locally with W&B's sweeps engine (no server needed)")
    sweep.add_argument("file", help="sweep YAML (the same file `wandb sweep` takes), or the name of one in ./sweeps or fdattack's own")
    sweep.add_argument(
        "--count",
        type=int,
        default=None,
        help="number of trials, those finished by an earlier call included (default: the whole grid; needed for random/bayes)",
    )
    sweep.add_argument("--root", default="runs/sweeps", help="folder for the trials' run directories")
    sweep.add_argument("overrides", nargs="*", help="extra key=value overrides for every trial")
    matrix = sub.add_parser(
        "matrix",
        help="every attack against every protocol under every defense: one simulation per cell and seed",
        description="Run a leakage matrix (conf/matrix/*.yaml): one simulation per (data, protocol, defense, seed), every applicable "
        "attack observing it; then matrix.json, matrix.csv, page/index.html and the tables. Running it again continues.",
    )
    matrix.add_argument("file", help="matrix YAML, or the name of a preset in ./conf/matrix or fdattack's own: small, gpu, paper")
    matrix.add_argument("--root", default=None, help="folder of the cells (default: runs/matrix/<name>)")
    matrix.add_argument("--jobs", type=int, default=1, help="simulations at once, each in its own process with its share of the cores")
    matrix.add_argument(
        "--cell", default=None, help="run one simulation, data/protocol/defense/seed or its index in --list (W&B agents, SLURM arrays)"
    )
    matrix.add_argument("--list", action="store_true", help="print the simulations with their index and state, run nothing")
    matrix.add_argument("--sweep-file", default=None, help="write a W&B sweep (grid over the simulations) to this path, run nothing")
    matrix.add_argument(
        "--decide",
        action="store_true",
        help="add seeds, a batch at a time, to the cells whose verdict is undecided, up to the file's decide: max_seeds and budget",
    )
    matrix.add_argument(
        "--isolation",
        choices=("in_process", "process"),
        default=None,
        help="where the attacks of every simulation run (isolation.mode; default: the file's). process: each in a sandboxed worker; "
        "its results are its own (the default root gets -process), never an in-process run's",
    )
    init = sub.add_parser(
        "init",
        help="copy fdattack's configs (conf/) and sweep files (sweeps/) into a folder, to edit them or give them to `wandb sweep`",
        description="Copy the configs and sweep files that fdattack ships into FOLDER/conf and FOLDER/sweeps. Files already there "
        "are kept. From that folder, names (fdattack run NAME, group=name) find the copies first.",
    )
    init.add_argument("folder", nargs="?", default=".", help="where conf/ and sweeps/ go (default: the working folder)")
    return parser


def _split_experiment(tokens: list[str]) -> tuple[str | None, list[str]]:
    if tokens and "=" not in tokens[0]:
        return tokens[0], tokens[1:]
    return None, tokens


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fdattack`` console script and ``python -m fdattack``."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "sweep" and all("=" in t and not t.startswith("-") for t in unknown):
        args.overrides = [*args.overrides, *unknown]  # overrides given after --count/--root
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command in ("run", "sweep", "matrix"):
        from fdattack.engine.malloc import keep_freed_memory

        keep_freed_memory()
    previous = signal.signal(signal.SIGTERM, raise_terminated) if threading.current_thread() is threading.main_thread() else None
    try:  # a run's own exit record (exit.json) takes over SIGTERM while its directory exists
        return _command(args)
    except FdattackError as err:
        print(f"fdattack: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fdattack: interrupted", file=sys.stderr)
        return 130
    except MatrixStopped as stop:  # its simulations recorded their stops in their folders; the matrix says how far it got
        print(f"fdattack: {stop}", file=sys.stderr)
        return int(stop.code)  # type: ignore[arg-type]
    except Terminated as stop:
        if not stop.recorded:
            print(f"fdattack: terminated by {stop.signal_name}", file=sys.stderr)
        return int(stop.code)  # type: ignore[arg-type]
    except Exception as err:  # a full disk surfaces wrapped by whichever writer hit it (torch.save, W&B, json)
        disk_error = _disk_error(err)
        if disk_error is None:
            raise
        print(f"fdattack: error: {disk_error}", file=sys.stderr)
        return 1
    finally:
        forget_terminated()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _command(args: argparse.Namespace) -> int:
    """Run the parsed command; its errors are :func:`main`'s to report."""
    if args.command == "run":
        return _run(args)
    if args.command == "sweep":
        return _sweep(args)
    if args.command == "init":
        return _init(Path(args.folder))
    if args.command == "matrix":
        from fdattack.config.packaged import matrix_file
        from fdattack.matrix.command import main as matrix_main

        root = Path(args.root) if args.root else None
        sweep_out = Path(args.sweep_file) if args.sweep_file else None
        return matrix_main(matrix_file(args.file), root, args.jobs, args.cell, args.list, sweep_out, args.decide, args.isolation)
    from fdattack.report.page import write_report

    print(f"fdattack: report in {write_report([Path(r) for r in args.runs], Path(args.out)).resolve()}")
    return 0


def _disk_error(err: BaseException) -> str | None:
    """One line for a full disk or quota anywhere in the chain of ``err`` (a logger may wrap the write's error), else None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_ERRORS:
            where = f" writing {current.filename}" if current.filename else ""
            return f"{DISK_ERRORS[current.errno]}{where}; {_after_full_disk(current.filename)}"
        current = current.__cause__ or current.__context__
    return None


def _after_full_disk(filename: object) -> str:
    """What to do once there is space again, by the run directory that holds ``filename`` (the folder above it with a
    run's lock file): resume from its last checkpoint, or run again where it wrote none."""
    from fdattack.tracking.run_dir import LOCK_NAME, RunDirectory

    path = Path(str(filename)).absolute() if filename else None
    run = next((folder for folder in path.parents if (folder / LOCK_NAME).is_file()), None) if path is not None else None
    if run is None:
        return "free some space and run the command again"
    latest = RunDirectory(run).checkpoints.latest()
    if latest is None:
        return f"the run in {run} wrote no checkpoint: free some space and run it again (resume=true has nothing to continue)"
    return f"what {run} recorded up to its last checkpoint (round {latest[0]}) is kept: free some space, then resume=true continues it"


def _run(args: argparse.Namespace) -> int:
    from fdattack.config import compose, help_config
    from fdattack.config.composition import load_named_plugins

    experiment, overrides = _split_experiment(list(args.tokens))
    if args.help_config:
        load_named_plugins(experiment, overrides)  # plugins=[...] among the tokens: their keys are listed too
        print(help_config())
        return 0
    cfg = compose(experiment, overrides)
    if args.print_config:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(cfg))
        return 0
    from fdattack.experiment import run
    from fdattack.tracking.stopped_attacks import listed, stopped_attacks

    stopped = stopped_attacks(run(cfg))
    if stopped:  # the run finished, but not every attack did: a script must be able to tell
        line = f"the run finished with {len(stopped)} attack(s) stopped: {listed(stopped)}; their final scores are null"
        print(f"fdattack: {line}", file=sys.stderr)
        return STOPPED_ATTACKS_STATUS
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from fdattack.config.packaged import sweep_file
    from fdattack.sweep import main as sweep_main

    if args.count is not None and args.count < 1:
        print("fdattack: error: --count must be >= 1", file=sys.stderr)
        return 2
    return sweep_main(sweep_file(args.file), args.count, Path(args.root), list(args.overrides))


def _init(folder: Path) -> int:
    from fdattack.config.packaged import copy_packaged

    written, kept = copy_packaged(folder)
    where = folder.resolve()
    kept_line = f"; kept {len(kept)} already there" if kept else ""
    print(f"fdattack: {len(written)} files in {where / 'conf'} and {where / 'sweeps'}{kept_line}")
    if written or kept:
        print(f"fdattack: from {where}: fdattack run pli_fedmd_digits, wandb sweep sweeps/pli_tau_gamma.yaml")
    return 0
