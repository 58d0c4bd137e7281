"""Partitions of a private pool over clients: pure functions of labels and a numpy Generator.

Each returns one index array per client (rows of the pool), pairwise disjoint.
"""

from __future__ import annotations

import numpy as np

from fdattack.errors import ConfigError

#: what the partitions cut: the private rows left after the public set and the test set are taken out
POOL = "the clients' pool"


def require(num_clients: int, partition: str, need: int, unit: str, why: str, have: int, where: str, fix: str) -> None:
    """Refuse, before any draw, a partition that cannot give every client what it needs; one message for every partition.

    Raises:
        ConfigError: ``protocol.num_clients=K with data.partition=P needs at least NEED UNIT (WHY), but WHERE has only HAVE;
        use fewer clients or FIX``
    """
    if need > have:
        raise ConfigError(
            f"protocol.num_clients={num_clients} with data.partition={partition} needs at least {need} {unit} ({why}), "
            f"but {where} has only {have}; use fewer clients or {fix}"
        )


def require_identities(num_targets: int, num_clients: int) -> None:
    """:func:`require` of :func:`disjoint_identities`, also checked at config time where ``data.num_targets`` is set."""
    require(
        num_clients,
        "disjoint_identities",
        num_clients,
        "target labels",
        "one identity per client",
        num_targets,
        "the split",
        "a larger data.num_targets",
    )


def disjoint_identities(target_labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Target labels split into K contiguous chunks (``np.array_split``; the PLI authors' code).

    Returns label chunks (not rows): client k owns the labels of chunk k.
    """
    require_identities(len(target_labels), num_clients)
    return [np.asarray(c) for c in np.array_split(np.asarray(target_labels), num_clients)]


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation cut into K near-equal parts."""
    require(num_clients, "iid", num_clients, "private samples", "one per client", n, POOL, "more data")
    return [np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]


def dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, min_size: int, rng: np.random.Generator, max_tries: int = 1000
) -> list[np.ndarray]:
    """Per-class Dirichlet(alpha) split with balancing, redrawn until every client has ``min_size`` rows (Shi et al.,
    PoPETs 2025, §4.1.1; the balancing of their code).

    Each class's rows are cut among the clients by a Dirichlet(alpha) draw, zeroed for the clients already holding
    n/K rows. A draw costs O(classes x K) array operations (no per-client Python loop), so ``max_tries`` draws stay
    quick even for many clients; sizes no draw can satisfy (K x ``min_size`` > n) are refused before the first.
    """
    n, need = len(labels), max(min_size, 1)
    require(
        num_clients,
        "dirichlet",
        num_clients * need,
        "private samples",
        f"{need} per client, data.min_client_size={min_size}",
        n,
        POOL,
        "a smaller data.min_client_size or more data",
    )
    best = num_clients
    for _ in range(max_tries):
        sizes = np.zeros(num_clients, dtype=np.int64)
        rows: list[np.ndarray] = []
        owners: list[np.ndarray] = []
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(alpha * np.ones(num_clients))
            q = q * (sizes < n / num_clients)
            q = q / q.sum() if q.sum() > 0 else np.ones(num_clients) / num_clients
            cuts = (np.cumsum(q) * len(idx)).astype(int)[:-1]
            pieces = np.diff(cuts, prepend=0, append=len(idx))  # the lengths of np.split(idx, cuts)
            sizes += pieces
            rows.append(idx)
            owners.append(np.repeat(np.arange(num_clients), pieces))
        short = int((sizes < need).sum())
        if not short:
            row, owner = np.concatenate(rows), np.concatenate(owners)
            order = np.lexsort((row, owner))  # by client, then by row
            return np.split(row[order].astype(np.int64), np.cumsum(sizes)[:-1])
        best = min(best, short)
    raise ConfigError(
        f"data.dirichlet_alpha={alpha}: no draw in {max_tries} gave every one of the {num_clients} clients "
        f"data.min_client_size={min_size} samples (the closest left {best} short); raise alpha or lower min_client_size or "
        "protocol.num_clients"
    )


def shards(labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al.'s label shards: sort by label, cut into K*s shards, give each client s random shards."""
    num_shards = num_clients * shards_per_client
    require(
        num_clients,
        "shards",
        num_shards,
        "private samples",
        f"data.shards_per_client={shards_per_client} non-empty shards per client",
        len(labels),
        POOL,
        "a smaller data.shards_per_client or more data",
    )
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in assignment]


def two_classes(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """L-Attack style (Xiao et al., DSN 2024, §VI-A: two classes a client; the pairing is a choice): client k holds
    classes c_k and c_{k+1} (cyclically); each class's samples are split equally between the two clients holding it."""
    classes = np.unique(labels)
    require(
        num_clients, "two_classes", num_clients, "private classes", "client k holds classes k and k+1", len(classes), POOL, "more classes"
    )
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for k in range(num_clients):
        for c in (classes[k % len(classes)], classes[(k + 1) % len(classes)]):
            holders[int(c)].append(k)
    buckets: list[list[int]] = [[] for _ in range(num_clients)]
    for c, owners in holders.items():
        if not owners:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for k, piece in zip(owners, np.array_split(idx, len(owners))):
            buckets[k].extend(piece.tolist())
    return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]


def assert_disjoint(parts: list[np.ndarray]) -> None:
    """Raise if any row appears in two parts."""
    joined = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    if len(np.unique(joined)) != len(joined):
        raise AssertionError("partition parts overlap")


def balanced_sample(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` rows without replacement, as evenly spread over the labels as the label counts allow (Shi et al., PoPETs 2025, §3.2):
    each label gets ``size // L`` rows (the remainder to random labels); a label short of rows gives all it has and
    the others make up the difference. Sorted."""
    classes = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    size = min(size, len(labels))
    quota = np.zeros(len(classes), dtype=np.int64)
    while quota.sum() < size:  # water-filling: raise every label that still has rows by one share
        open_ = [i for i, rows in enumerate(classes) if quota[i] < len(rows)]
        share, extra = divmod(int(size - quota.sum()), len(open_))
        lucky = set(rng.choice(open_, size=extra, replace=False).tolist()) if extra else set()
        for i in open_:
            quota[i] = min(len(classes[i]), quota[i] + share + (i in lucky))
    return np.sort(np.concatenate([rows[:q] for rows, q in zip(classes, quota)]))
