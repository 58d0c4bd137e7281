"""Inversion-network benchmarks of PLI: fdattack's training step against a plain PyTorch loop.

``throughput``: images per second of one inversion-training step (pli.md §7.2, Eq. 3) done the way
fdattack does it (an ``InversionLitModule`` set up on the Fabric engine, one ``LocalTrainer.fit_module``
call per epoch driving its ``training_step``, as ``PLIAttack`` trains) and the way a plain loop does it (``InversionDecoder`` +
``torch.optim.Adam`` +
``F.mse_loss``, the prior term added by hand), on the same network, synthetic data and batches:
J classes → input 2J ([p0, pk]), C×S×S images, batch 8 and max_width 1024 as in the paper. Each
(implementation, repeat) runs in its own subprocess, alternating, so machine noise hits both alike;
the table gives the median over repeats and the ratio fdattack / plain (target: >= 0.9). Each worker
imports only what its implementation needs (start-up is never timed, but it is most of the wall time).

``memory``: peak resident memory of whole PLI rounds (every client's Eq. 3 + Eq. 10 training, Eq. 7
reconstruction and Eq. 11 selection) with K clients at J classes and C×S×S images, with the clients'
networks persisted on disk between rounds (fdattack's run directories) and, for contrast, kept in memory.
Target: peak at K = 10 within 1.5x the peak at K = 1 with the disk store.

``gan``: FedInverse's GAN model inversion (fedinverse.md §4.1, §4.2) on the same networks, fdattack against a
plain PyTorch loop written here: latent-search iterations/s of GMI (``gmi_search``: S restarts × T labels in one
batch, hand-written Nesterov step) and KED-MI (``kedmi_search``: Adam on μ and log σ²) against the MCNN target, both
with the HSIC term at ``--hsic-lambda``, and GAN pretraining images/s of ``WGANGP`` and ``KPlusOneGAN`` driven by the
Fabric engine as the attacks train them (``LocalTrainer.fit_module``, one call per epoch, full batches) against the
same losses and Adam steps by hand. Each (task, implementation, repeat) runs in its own subprocess, alternating; the
table gives medians, the ratio fdattack / plain (target: >= 0.8) and peak memory: on CUDA
``torch.cuda.max_memory_allocated`` of the timed part, on CPU the process's peak RSS and its growth over the timed
part (tracemalloc does not see torch's CPU tensors).

Usage: ``python benchmarks/bench_inversion.py throughput [--classes 1000] [--image-size 64] [--steps 20] ...``
       ``python benchmarks/bench_inversion.py memory [--clients 1 10] [--classes 1000] [--image-size 64] ...``
       ``python benchmarks/bench_inversion.py gan [--image-size 32] [--width 64] [--device cpu|cuda] ...``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from fdattack.models.inversion import InversionDecoder

IMPLEMENTATIONS = {
    "fdattack": "fdattack (InversionLitModule through the Fabric engine)",
    "plain": "plain (InversionDecoder + Adam + F.mse_loss)",
}
LR, WEIGHT_DECAY = 3e-5, 1e-4  # pli.md §7.8

Train = Callable[[list[dict[str, Tensor]]], None]


# ------------------------------------------------------------------------------------ shared helpers
def machine() -> str:
    """One line naming the machine the numbers come from."""
    return f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table, the first column left-aligned and the others right-aligned."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join([":---"] + ["---:"] * (len(headers) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def run_worker(argv: list[str], threads: int) -> dict:
    """Run this script with ``argv`` in a fresh process; its last stdout line is a JSON object."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {argv} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ throughput
def synthetic_batches(args: argparse.Namespace, count: int) -> list[dict[str, Tensor]]:
    """PLI's Eq. 3 batches: tempered probability pairs [p0, pk] (B, 2J), images and the prior (B, C, S, S)."""
    generator = torch.Generator().manual_seed(0)
    b, j, c, s = args.batch_size, args.classes, args.channels, args.image_size
    prior = torch.rand(1, c, s, s, generator=generator) * 2 - 1
    batches = []
    for _ in range(count):
        logits = torch.randn(b, 2, j, generator=generator)
        inputs = torch.softmax(logits / 3.0, dim=-1).reshape(b, 2 * j)
        images = torch.rand(b, c, s, s, generator=generator) * 2 - 1
        batches.append({"input": inputs, "x": images, "prior": prior.expand(b, -1, -1, -1)})
    return batches


def decoder(args: argparse.Namespace) -> InversionDecoder:
    """The paper's G for these sizes, seeded so both implementations start from the same weights."""
    from fdattack.models.inversion import InversionDecoder

    torch.manual_seed(0)
    return InversionDecoder(2 * args.classes, args.channels, args.image_size, args.max_width)


def fdattack_training(args: argparse.Namespace) -> Train:
    """What ``PLIAttack`` does per epoch: one engine call over the rows, the module's own ``training_step``."""
    from fdattack.engine import TensorRows, default_engine
    from fdattack.lit.inversion import InversionLitModule

    engine = default_engine(args.batch_size)
    handle = engine.setup("inversion", InversionLitModule(decoder(args), LR, WEIGHT_DECAY, args.gamma))

    def train(batches: list[dict[str, Tensor]]) -> None:
        rows = TensorRows(**{key: torch.cat([b[key] for b in batches]) for key in batches[0]})
        engine.fit_module(handle, rows, 1, 0, batch_size=args.batch_size, shuffle=False)

    return train


def plain_training(args: argparse.Namespace) -> Train:
    """The same steps written by hand."""
    net = decoder(args)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    net.train()

    def train(batches: list[dict[str, Tensor]]) -> None:
        for batch in batches:
            out = net(batch["input"])
            loss = F.mse_loss(out, batch["x"])
            if args.gamma > 0:
                loss = loss + args.gamma * F.mse_loss(out, batch["prior"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    return train


def throughput_worker(args: argparse.Namespace) -> None:
    """Time ``--steps`` steps after ``--warmup`` untimed ones; print images/s as JSON."""
    torch.set_num_threads(args.threads)
    train = (fdattack_training if args.worker == "fdattack" else plain_training)(args)
    batches = synthetic_batches(args, args.warmup + args.steps)
    train(batches[: args.warmup])
    start = time.perf_counter()
    train(batches[args.warmup :])
    elapsed = time.perf_counter() - start
    print(json.dumps({"images_per_s": args.steps * args.batch_size / elapsed}))


def throughput_flags(args: argparse.Namespace) -> list[str]:
    """The sizes as command-line flags, to hand to a worker."""
    names = ("classes", "image_size", "channels", "batch_size", "max_width", "gamma", "steps", "warmup", "threads")
    return [item for name in names for item in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]


def throughput(args: argparse.Namespace) -> None:
    """Alternate the implementations in subprocesses, ``--repeats`` times; print the table."""
    if args.worker:
        throughput_worker(args)
        return
    samples: dict[str, list[float]] = {impl: [] for impl in IMPLEMENTATIONS}
    for _ in range(args.repeats):
        for impl in IMPLEMENTATIONS:
            row = run_worker(["throughput", *throughput_flags(args), "--worker", impl], args.threads)
            samples[impl].append(row["images_per_s"])
    medians = {impl: statistics.median(values) for impl, values in samples.items()}
    rows = [[label, f"{medians[impl]:.1f}", f"{medians[impl] / medians['plain']:.2f}"] for impl, label in IMPLEMENTATIONS.items()]
    print(
        f"Inversion training (Eq. 3, gamma {args.gamma}): J = {args.classes} (input {2 * args.classes}), "
        f"{args.channels}x{args.image_size}x{args.image_size}, batch {args.batch_size}, max_width {args.max_width}; "
        f"{args.steps} timed steps after {args.warmup}, median of {args.repeats} repeats, {args.threads} thread(s) per process."
    )
    print(f"Machine: {machine()}")
    print()
    print(markdown_table(["implementation", "images/s", "ratio (fdattack/plain)"], rows))


def add_throughput_parser(subparsers: argparse._SubParsersAction) -> None:
    """The ``throughput`` subcommand (each measurement is a subcommand with its own ``add_*_parser``)."""
    p = subparsers.add_parser("throughput", help="images/s of inversion training, fdattack against a plain loop")
    p.add_argument("--classes", type=int, default=1000, help="J; the network's input is 2J (default 1000, LFW/LAG)")
    p.add_argument("--image-size", type=int, default=64, help="side S of the images (default 64)")
    p.add_argument("--channels", type=int, default=3, help="C (default 3)")
    p.add_argument("--batch-size", type=int, default=8, help="inversion batch size (default 8, the paper)")
    p.add_argument("--max-width", type=int, default=1024, help="widest feature map (default 1024, the paper)")
    p.add_argument("--gamma", type=float, default=0.03, help="prior weight; > 0 adds the prior MSE term (default 0.03)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per process (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--repeats", type=int, default=3, help="processes per implementation (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--worker", choices=sorted(IMPLEMENTATIONS), help=argparse.SUPPRESS)
    p.set_defaults(func=throughput)


# ------------------------------------------------------------------------------------ memory
def peak_rss_mb() -> float:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_worker(args: argparse.Namespace) -> None:
    """Run ``--rounds`` PLI rounds on synthetic public data and fake client outputs; print peak RSS as JSON."""
    from fdattack.attacks.base import AttackContext
    from fdattack.attacks.pli import PLIAttack, PLISettings
    from fdattack.attacks.priors import PriorKind, PriorSettings
    from fdattack.attacks.state_store import ClientStateStore
    from fdattack.data.imageset import ImageSet
    from fdattack.fd.record import PublicQuery, RoundRecord
    from fdattack.fd.threat import AttackerView, ThreatModel

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    n, j, c, s = args.public, args.classes, args.channels, args.image_size
    public = ImageSet.from_images(torch.rand(n, c, s, s, generator=g) * 2 - 1, torch.arange(n) % j, torch.zeros(n, dtype=torch.long))
    threat = ThreatModel("server", "logits", public_labels_known=True, query_rows="public")
    view = AttackerView(threat, "fedmd", public, tuple(range(args.targets)), j, (c, s, s), has_server_model=True)
    clients = tuple(range(args.worker_clients))

    def answer(model: int | str, rows: Tensor) -> Tensor:
        seed = 10_007 if model == "server" else int(model)
        return torch.randn(n, j, generator=torch.Generator().manual_seed(seed))[rows]

    settings = PLISettings(
        max_width=args.max_width, epochs_per_round=1, batch_size=args.batch_size, prior=PriorSettings(kind=PriorKind.naive)
    )
    baseline = peak_rss_mb()
    with tempfile.TemporaryDirectory() as folder:
        store = ClientStateStore(Path(folder) if args.store == "disk" else None)
        attack = PLIAttack(view, settings, AttackContext(seed=0, store=store))
        started = time.perf_counter()
        for round in range(1, args.rounds + 1):
            query = PublicQuery(answer, round, "server_train", torch.arange(n), clients, has_server=True)
            attack.on_record(
                RoundRecord(round=round, phase="server_train", protocol="fedmd", participants=clients, attack_point=True, query=query)
            )
            query.close()
            attack.on_round_end(round)
        elapsed = time.perf_counter() - started
    print(json.dumps({"peak_mb": peak_rss_mb(), "baseline_mb": baseline, "seconds": elapsed}))


def memory(args: argparse.Namespace) -> None:
    """One subprocess per (store, K); print the table with each K's peak relative to K = 1."""
    if args.worker:
        memory_worker(args)
        return
    flags = [
        "--classes",
        str(args.classes),
        "--image-size",
        str(args.image_size),
        "--channels",
        str(args.channels),
        "--max-width",
        str(args.max_width),
        "--batch-size",
        str(args.batch_size),
        "--public",
        str(args.public),
        "--targets",
        str(args.targets),
        "--rounds",
        str(args.rounds),
        "--threads",
        str(args.threads),
    ]
    rows, first = [], {}
    for store in ("disk", "memory"):
        for k in args.clients:
            result = run_worker(["memory", *flags, "--store", store, "--worker-clients", str(k), "--worker", "yes"], args.threads)
            first.setdefault(store, result["peak_mb"])
            rows.append(
                [
                    store,
                    str(k),
                    f"{result['peak_mb']:.0f}",
                    f"{result['peak_mb'] - result['baseline_mb']:.0f}",
                    f"{result['peak_mb'] / first[store]:.2f}",
                    f"{result['seconds']:.0f}",
                ]
            )
    print(
        f"PLI rounds: J = {args.classes}, {args.channels}x{args.image_size}x{args.image_size}, max_width {args.max_width}, "
        f"|D_0| = {args.public}, {args.targets} targets, {args.rounds} rounds, batch {args.batch_size}, {args.threads} thread(s)."
    )
    print(f"Machine: {machine()}")
    print()
    print(markdown_table(["client store", "K", "peak RSS MB", "attack's share MB", f"ratio to K = {args.clients[0]}", "s"], rows))


def add_memory_parser(subparsers: argparse._SubParsersAction) -> None:
    """The ``memory`` subcommand."""
    p = subparsers.add_parser("memory", help="peak memory of PLI rounds against the number of clients K")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 10], help="values of K; the first is the reference (default 1 10)")
    p.add_argument("--classes", type=int, default=1000, help="J (default 1000)")
    p.add_argument("--image-size", type=int, default=64, help="side S of the images (default 64)")
    p.add_argument("--channels", type=int, default=3, help="C (default 3)")
    p.add_argument("--max-width", type=int, default=1024, help="widest feature map (default 1024, the paper)")
    p.add_argument("--batch-size", type=int, default=8, help="inversion batch size (default 8)")
    p.add_argument("--public", type=int, default=16, help="|D_0|, sensitive public images (default 16)")
    p.add_argument("--targets", type=int, default=16, help="target labels reconstructed (default 16)")
    p.add_argument("--rounds", type=int, default=2, help="rounds; the second reloads every client's network (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--store", choices=("disk", "memory"), default="disk", help=argparse.SUPPRESS)
    p.add_argument("--worker-clients", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.set_defaults(func=memory)


# ------------------------------------------------------------------------------------ gan (FedInverse)
GAN_TASKS = {
    "gmi_search": ("GMI latent search", "iterations/s"),
    "kedmi_search": ("KED-MI latent search", "iterations/s"),
    "wgangp": ("WGAN-GP prior training", "images/s"),
    "kplus1": ("K+1 GAN training", "images/s"),
}
GAN_IMPLEMENTATIONS = {"fdattack": "fdattack", "plain": "plain loop"}
Timed = Callable[[], float]  #: runs the timed part once; returns the work units done (iterations or images)


def gan_networks(args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    """Generator, critic, K+1 discriminator and MCNN target at the benchmark's sizes, seeded, on the device."""
    from fdattack.models.classifiers import build_classifier
    from fdattack.models.gan import DGWGAN, Generator, MinibatchDiscriminator

    torch.manual_seed(0)
    c, s, k = args.channels, args.image_size, args.classes
    nets = {
        "generator": Generator(c, s, args.z_dim, args.width),
        "critic": DGWGAN(c, s, args.width),
        "discriminator": MinibatchDiscriminator(c, s, k, args.width),
        "target": build_classifier("fedinverse_cnn", c, s, k),
    }
    return {name: net.to(args.device) for name, net in nets.items()}


def frozen(*nets: torch.nn.Module) -> None:
    for net in nets:
        net.requires_grad_(False).eval()


def hsic_term(args: argparse.Namespace) -> Callable[[Tensor], Tensor] | None:
    """The signed λ_H term both implementations add (fdattack's functional; the code's nHSIC, sign +1)."""
    from functools import partial

    from fdattack.functional.hsic import hsic_loss_term

    return partial(hsic_loss_term, lambda_h=args.hsic_lambda, sign=1) if args.hsic_lambda > 0 else None


def search_setup(args: argparse.Namespace) -> Timed:
    """One latent search of ``--iterations`` iterations (GMI: ``--seeds`` restarts × ``--labels`` labels)."""
    nets = gan_networks(args)
    g, critic, disc, target = nets["generator"], nets["critic"], nets["discriminator"], nets["target"]
    frozen(*nets.values())
    labels = torch.arange(args.labels, device=args.device) % args.classes
    z0 = torch.randn(args.seeds, args.labels, args.z_dim, generator=torch.Generator().manual_seed(1)).clamp(-1, 1).to(args.device)
    hsic, lr, lam, n = hsic_term(args), 0.02, 100.0, args.iterations
    noise = torch.Generator(device=args.device).manual_seed(2)
    if args.worker == "plain":
        if args.worker_task == "gmi_search":
            return lambda: plain_gmi_search(g, critic, target, labels, z0, n, lr, lam, hsic)
        return lambda: plain_kedmi_search(g, disc, target, labels, n, args.z_dim, lr, lam, hsic, noise)
    from fdattack.attacks.gmi import gmi_search
    from fdattack.attacks.kedmi import kedmi_search

    def search() -> float:  # what the attacks' ``search`` calls
        if args.worker_task == "gmi_search":
            gmi_search(g, critic, target, labels, z0, range(n), lr=lr, lambda_id=lam, hsic=hsic)
        else:
            kedmi_search(g, disc, target, labels, range(n), z_dim=args.z_dim, lr=lr, lambda_id=lam, hsic=hsic, noise=noise)
        return n

    return search


def plain_gmi_search(
    g: torch.nn.Module,
    critic: torch.nn.Module,
    target: torch.nn.Module,
    labels: Tensor,
    z: Tensor,
    iterations: int,
    lr: float,
    lam: float,
    hsic: Callable[[Tensor], Tensor] | None,
    momentum: float = 0.9,
) -> float:
    """GMI's attack loop as the authors write it, all restarts in one batch."""
    s, t, d = z.shape
    y, v = labels.repeat(s), torch.zeros_like(z)
    for _ in range(iterations):
        z = z.detach().requires_grad_(True)
        x = g(z.view(s * t, d))
        loss = (
            -critic(x).view(s, t).mean(dim=1).sum()
            + lam * F.cross_entropy(target(2 * x - 1), y, reduction="none").view(s, t).mean(dim=1).sum()
        )
        if hsic is not None:
            loss = loss + sum(hsic(batch) for batch in x.view(s, t, *x.shape[1:]))
        loss.backward()
        with torch.no_grad():
            v_prev, v = v, momentum * v - lr * z.grad
            z = (z - momentum * v_prev + (1 + momentum) * v).clamp(-1, 1)
    return iterations


def plain_kedmi_search(
    g: torch.nn.Module,
    disc: torch.nn.Module,
    target: torch.nn.Module,
    labels: Tensor,
    iterations: int,
    z_dim: int,
    lr: float,
    lam: float,
    hsic: Callable[[Tensor], Tensor] | None,
    noise: torch.Generator,
) -> float:
    """KED-MI's distributional search as the authors write it."""
    mu = torch.zeros(len(labels), z_dim, device=labels.device, requires_grad=True)
    log_var = torch.zeros(len(labels), z_dim, device=labels.device, requires_grad=True)
    optimizer = torch.optim.Adam([mu, log_var], lr=lr)
    for _ in range(iterations):
        x = g(mu + torch.exp(0.5 * log_var) * torch.randn(mu.shape, generator=noise, device=mu.device))
        lse = torch.logsumexp(disc(x)[1], dim=1)
        loss = (F.softplus(lse) - lse).mean() + lam * F.cross_entropy(target(2 * x - 1), labels)
        if hsic is not None:
            loss = loss + hsic(x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return iterations


def gan_images(args: argparse.Namespace) -> Tensor:
    return (
        torch.rand(args.gan_images, args.channels, args.image_size, args.image_size, generator=torch.Generator().manual_seed(3)) * 2 - 1
    ).to(args.device)


def training_setup(args: argparse.Namespace) -> Timed:
    """``--epochs`` epochs of GAN training on ``--gan-images`` synthetic images in [-1, 1]."""
    images, b = gan_images(args), args.batch_size
    steps = args.gan_images // b
    if args.worker == "plain":
        nets = gan_networks(args)
        train = plain_wgangp if args.worker_task == "wgangp" else plain_kplus1
        return lambda: train(nets, images, args.epochs, b, args.n_critic)
    from fdattack.attacks.gan_inversion import full_batches, seeded
    from fdattack.attacks.kedmi import PriorViews
    from fdattack.engine import LocalTrainer, TensorRows, make_fabric
    from fdattack.lit.gan import WGANGP, KPlusOneGAN

    torch.manual_seed(0)
    c, s = args.channels, args.image_size
    if args.worker_task == "wgangp":
        module = WGANGP(c, s, args.z_dim, args.width, n_critic=args.n_critic)

        def rows(epoch: int) -> object:
            return TensorRows(x=images)
    else:
        target = gan_networks(args)["target"]
        frozen(target)
        module = KPlusOneGAN(c, s, target, args.classes, args.z_dim, args.width, n_critic=args.n_critic)

        def rows(epoch: int) -> object:
            return PriorViews(images, torch.Generator().manual_seed(epoch))

    engine = LocalTrainer(make_fabric(args.device, 1, "auto", 1, "32-true"), b)
    handle = engine.setup("gan", module)

    def train() -> float:  # GANInversionAttack.train_gan's loop
        with seeded(0, torch.device(args.device)):
            for epoch in range(args.epochs):
                engine.fit_module(handle, rows(epoch), 1, epoch, batch_size=b, sampler=full_batches)  # type: ignore[arg-type]
        return args.epochs * steps * b

    return train


def _adam(net: torch.nn.Module) -> torch.optim.Adam:
    return torch.optim.Adam(net.parameters(), lr=2e-4, betas=(0.5, 0.999))


def plain_wgangp(nets: dict[str, torch.nn.Module], images: Tensor, epochs: int, b: int, n_critic: int) -> float:
    """GMI's WGAN-GP loop as the authors write it (gradient penalty 10)."""
    g, d = nets["generator"], nets["critic"]
    g_opt, d_opt = _adam(g), _adam(d)
    step = 0
    for epoch in range(epochs):
        for idx in torch.randperm(len(images), generator=torch.Generator().manual_seed(epoch))[: len(images) // b * b].split(b):
            real = (images[idx.to(images.device)] + 1) / 2
            z = torch.randn(b, g.z_dim, device=real.device)
            fake = g(z).detach()
            alpha = torch.rand(b, 1, 1, 1, device=real.device)
            mixed = (real + alpha * (fake - real)).requires_grad_(True)
            (grad,) = torch.autograd.grad(d(mixed).sum(), mixed, create_graph=True)
            gp = ((grad.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
            d_loss = -(d(real).mean() - d(fake).mean()) + 10 * gp
            d_opt.zero_grad()
            d_loss.backward()
            d_opt.step()
            step += 1
            if step % n_critic == 0:
                d.requires_grad_(False)
                g_loss = -d(g(torch.randn(b, g.z_dim, device=real.device))).mean()
                g_opt.zero_grad()
                g_loss.backward()
                g_opt.step()
                d.requires_grad_(True)
    return epochs * (len(images) // b) * b


def plain_kplus1(nets: dict[str, torch.nn.Module], images: Tensor, epochs: int, b: int, n_critic: int) -> float:
    """KED-MI's K+1 GAN loop as the authors write it: soft labels, three views of the public data, feature matching."""
    g, d, target = nets["generator"], nets["discriminator"], nets["target"]
    frozen(target)
    g_opt, d_opt = _adam(g), _adam(d)
    step = 0
    for epoch in range(epochs):
        shuffle = torch.Generator().manual_seed(epoch)
        order, unlabeled, moment = (torch.randperm(len(images), generator=shuffle).to(images.device) for _ in range(3))
        for idx in order[: len(images) // b * b].split(b):
            x, xu, xm = images[idx], images[unlabeled[idx]], images[moment[idx]]
            with torch.no_grad():
                soft = F.softmax(target(x), dim=1)
                fake = g(torch.randn(b, g.z_dim, device=x.device))
            labeled, lse_u, lse_f = d((x + 1) / 2)[1], torch.logsumexp(d((xu + 1) / 2)[1], dim=1), torch.logsumexp(d(fake)[1], dim=1)
            d_loss = -(soft * F.log_softmax(labeled, dim=1)).sum(dim=1).mean() + 0.5 * (
                (F.softplus(lse_u) - lse_u).mean() + F.softplus(lse_f).mean()
            )
            d_opt.zero_grad()
            d_loss.backward()
            d_opt.step()
            step += 1
            if step % n_critic == 0:
                d.requires_grad_(False)
                f_fake, logits = d(g(torch.randn(b, g.z_dim, device=x.device)))
                f_real = d((xm + 1) / 2)[0]
                p = F.softmax(logits, dim=1)
                g_loss = (f_real.mean(dim=0) - f_fake.mean(dim=0)).abs().mean() - 1e-4 * (p * F.log_softmax(logits, dim=1)).sum()
                g_opt.zero_grad()
                g_loss.backward()
                g_opt.step()
                d.requires_grad_(True)
    return epochs * (len(images) // b) * b


def gan_worker(args: argparse.Namespace) -> None:
    """Set up, run the timed part once untimed (warm-up), then time it; print the rate and peak memory as JSON."""
    torch.set_num_threads(args.threads)
    timed = (search_setup if args.worker_task.endswith("_search") else training_setup)(args)
    cuda = args.device == "cuda"
    timed()  # warm-up: allocator, kernels, optimizer state
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = peak_rss_mb()
    start = time.perf_counter()
    units = timed()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    memory = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mb()
    print(json.dumps({"rate": units / elapsed, "peak_mb": memory, "growth_mb": 0.0 if cuda else peak_rss_mb() - before}))


def gan_flags(args: argparse.Namespace) -> list[str]:
    names = (
        "image_size",
        "channels",
        "classes",
        "z_dim",
        "width",
        "labels",
        "seeds",
        "iterations",
        "hsic_lambda",
        "gan_images",
        "batch_size",
        "epochs",
        "n_critic",
        "threads",
        "device",
    )
    return [item for name in names for item in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]


def gan(args: argparse.Namespace) -> None:
    """Alternate the implementations of every task in subprocesses, ``--repeats`` times; print the table."""
    if args.worker:
        gan_worker(args)
        return
    samples = {(task, impl): [] for task in args.tasks for impl in GAN_IMPLEMENTATIONS}
    for repeat in range(args.repeats):
        for task in args.tasks:
            for impl in list(GAN_IMPLEMENTATIONS) if repeat % 2 == 0 else list(reversed(GAN_IMPLEMENTATIONS)):
                samples[(task, impl)].append(run_worker(["gan", *gan_flags(args), "--worker-task", task, "--worker", impl], args.threads))
    memory = "peak CUDA MB" if args.device == "cuda" else "peak RSS MB (growth)"
    rows = []
    for task in args.tasks:
        what, unit = GAN_TASKS[task]
        rate = {impl: statistics.median(r["rate"] for r in samples[(task, impl)]) for impl in GAN_IMPLEMENTATIONS}
        for impl, label in GAN_IMPLEMENTATIONS.items():
            peak = max(r["peak_mb"] for r in samples[(task, impl)])
            growth = max(r["growth_mb"] for r in samples[(task, impl)])
            rows.append(
                [
                    f"{what}, {label}",
                    f"{rate[impl]:.1f} {unit}",
                    f"{rate[impl] / rate['plain']:.2f}",
                    f"{peak:.0f}" if args.device == "cuda" else f"{peak:.0f} (+{growth:.0f})",
                ]
            )
    c, s = args.channels, args.image_size
    print(
        f"FedInverse GAN inversion: {c}x{s}x{s} images, z_dim {args.z_dim}, GAN width {args.width}, K = {args.classes}, MCNN target; "
        f"search: {args.seeds} GMI restarts x {args.labels} labels (KED-MI: {args.labels} labels), {args.iterations} timed iterations, "
        f"lambda_H {args.hsic_lambda}; GAN training: {args.gan_images} images, batch {args.batch_size}, n_critic {args.n_critic}, "
        f"{args.epochs} timed epoch(s); each after one untimed run; median of {args.repeats} repeats, {args.threads} thread(s), "
        f"{args.device}."
    )
    print(f"Machine: {machine()}" + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""))
    print()
    print(markdown_table(["task, implementation", "throughput", "ratio (fdattack/plain)", memory], rows))


def add_gan_parser(subparsers: argparse._SubParsersAction) -> None:
    """The ``gan`` subcommand (defaults: MNIST at the spec's sizes)."""
    p = subparsers.add_parser("gan", help="GMI/KED-MI latent search and GAN training, fdattack against a plain loop")
    p.add_argument("--tasks", nargs="+", choices=sorted(GAN_TASKS), default=list(GAN_TASKS), help="what to time (default all)")
    p.add_argument("--image-size", type=int, default=32, help="side S, a power of two >= 8 (default 32, MNIST)")
    p.add_argument("--channels", type=int, default=1, help="C (default 1)")
    p.add_argument("--classes", type=int, default=5, help="K, the target model's classes (default 5)")
    p.add_argument("--z-dim", type=int, default=100, help="latent size (default 100)")
    p.add_argument("--width", type=int, default=64, help="GAN base width (default 64, the code's dim)")
    p.add_argument("--labels", type=int, default=5, help="target labels per latent batch (default 5, MNIST)")
    p.add_argument("--seeds", type=int, default=10, help="GMI restarts, batched (default 10)")
    p.add_argument("--iterations", type=int, default=50, help="timed search iterations (default 50)")
    p.add_argument("--hsic-lambda", type=float, default=0.05, help="lambda_H of the HSIC term, 0 = none (default 0.05)")
    p.add_argument("--gan-images", type=int, default=640, help="prior images per GAN epoch (default 640)")
    p.add_argument("--batch-size", type=int, default=64, help="GAN batch size (default 64)")
    p.add_argument("--epochs", type=int, default=1, help="timed GAN epochs (default 1)")
    p.add_argument("--n-critic", type=int, default=5, help="discriminator steps per generator step (default 5)")
    p.add_argument("--repeats", type=int, default=3, help="processes per (task, implementation) (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the networks run (default cpu)")
    p.add_argument("--worker-task", choices=sorted(GAN_TASKS), help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=sorted(GAN_IMPLEMENTATIONS), help=argparse.SUPPRESS)
    p.set_defaults(func=gan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_throughput_parser(subparsers)
    add_memory_parser(subparsers)
    add_gan_parser(subparsers)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
