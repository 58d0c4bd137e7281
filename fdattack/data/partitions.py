"""Partitions of a private pool over clients: pure functions of labels and a numpy Generator.

Each returns one index array per client (rows of the pool), pairwise disjoint.
"""

from __future__ import annotations

import numpy as np

from fdattack.errors import ConfigError


def disjoint_identities(target_labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Target labels split into K contiguous chunks (``np.array_split``; pli.md §3.2).

    Returns label chunks (not rows): client k owns the labels of chunk k.
    """
    if num_clients > len(target_labels):
        raise ConfigError(
            f"protocol.num_clients={num_clients} is more than the {len(target_labels)} target labels "
            "(data.num_targets); every client needs at least one identity"
        )
    return [np.asarray(c) for c in np.array_split(np.asarray(target_labels), num_clients)]


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation cut into K near-equal parts."""
    return [np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]


def dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, min_size: int, rng: np.random.Generator, max_tries: int = 1000
) -> list[np.ndarray]:
    """Per-class Dirichlet(alpha) split with balancing, redrawn until every client has ``min_size`` rows (pdafd.md §7.2)."""
    n = len(labels)
    for _ in range(max_tries):
        buckets: list[list[int]] = [[] for _ in range(num_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(alpha * np.ones(num_clients))
            q = q * np.array([len(b) < n / num_clients for b in buckets])
            q = q / q.sum() if q.sum() > 0 else np.ones(num_clients) / num_clients
            cuts = (np.cumsum(q) * len(idx)).astype(int)[:-1]
            for b, piece in zip(buckets, np.split(idx, cuts)):
                b.extend(piece.tolist())
        if min(len(b) for b in buckets) >= max(min_size, 1):
            return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]
    raise ConfigError(
        f"data.dirichlet_alpha={alpha}: no draw in {max_tries} gave every one of the {num_clients} clients "
        f"data.min_client_size={min_size} samples; raise alpha or lower min_client_size or protocol.num_clients"
    )


def shards(labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al.'s label shards: sort by label, cut into K*s shards, give each client s random shards."""
    order = np.argsort(labels, kind="stable")
    num_shards = num_clients * shards_per_client
    if num_shards > len(labels):
        raise ConfigError(f"protocol.num_clients*data.shards_per_client={num_shards} shards exceed the {len(labels)} private samples")
    pieces = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in assignment]


def two_classes(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """L-Attack style (lattack.md §2): client k holds classes c_k and c_{k+1} (cyclically); each class's samples
    are split equally between the two clients holding it."""
    classes = np.unique(labels)
    if num_clients > len(classes):
        raise ConfigError(f"protocol.num_clients={num_clients} exceeds the {len(classes)} private classes of data.partition=two_classes")
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
    """``size`` rows without replacement, as evenly spread over the labels as the label counts allow (pdafd.md §5.2, A8):
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
