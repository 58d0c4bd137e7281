"""Server-side aggregation rules as pure tensor functions.

Shapes: K clients, N public samples, J classes, B rows of a minibatch.

| rule | protocol | source |
|---|---|---|
| :func:`mean_logits` | FedMD consensus | Takahashi et al., CVPR 2023, App. B; Shi et al., PoPETs 2025, §2.1 |
| :func:`era` | DS-FL entropy-reduction aggregation | Takahashi et al., CVPR 2023, App. B; Shi et al., PoPETs 2025, §2.1 |
| :func:`fedgems_ensemble`, :func:`fedgems_fusion_loss` | FedGEMS knowledge fusion | Takahashi et al., CVPR 2023, App. B; their code |
| :func:`diakonikolas_filter`, :func:`robust_mean` | Cronus robust mean | Shi et al., PoPETs 2025, §2.1 |
| :func:`fedavg` | FedAvg weighted state mean | Wu et al., ICLR 2024, §2.1, Algorithm 1 |
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from fdattack.functional import entropy

KL_MODES = ("code", "standard")


def _check_uploads(uploads: Tensor) -> None:
    if uploads.ndim != 3 or uploads.shape[0] == 0:
        raise ValueError(f"uploads must have shape (K, N, J) with K >= 1, got {tuple(uploads.shape)}")


# ---------------------------------------------------------------------------------------------- FedMD, DS-FL
def mean_logits(uploads: Tensor) -> Tensor:
    """FedMD consensus l^p_i = (1/K) Σ_k l^k_i (Takahashi et al., CVPR 2023, App. B).

    Args:
        uploads: (K, N, J) raw logits of the K clients on N public samples.

    Returns:
        (N, J) mean logits.
    """
    _check_uploads(uploads)
    return uploads.mean(dim=0)


def softmax_uploads(logits: Tensor) -> Tensor:
    """Client-side probabilities q^k_i = softmax(l^k_i) over the last (class) axis, any leading shape."""
    return torch.softmax(logits, dim=-1)


def era(probs: Tensor, temperature: float) -> Tensor:
    """Entropy-reduction aggregation q^p_i = softmax(q̄_i / T), q̄_i = (1/K) Σ_k q^k_i (Takahashi et al., CVPR 2023,
    App. B; Shi et al., PoPETs 2025, §2.1).

    Args:
        probs: (K, N, J) client probabilities (apply :func:`softmax_uploads` to uploaded logits first).
        temperature: T_ERA > 0 (0.1 in DS-FL); lower is sharper.

    Returns:
        (N, J) sharpened probabilities.
    """
    _check_uploads(probs)
    if temperature <= 0:
        raise ValueError(f"ERA temperature must be > 0, got {temperature}")
    return torch.softmax(probs.mean(dim=0) / temperature, dim=-1)


# ---------------------------------------------------------------------------------------------- FedGEMS
def fedgems_ensemble(client_logits: Tensor, labels: Tensor) -> Tensor:
    """FedGEMS client-knowledge ensemble for samples the server gets wrong (case S3 of the PLI authors' FedGEMS code).

    w_{k,i} = 1 / H(softmax(l^k_i)) if argmax l^k_i = y_i else 0;  ω_{·,i} = softmax_k(w_{·,i});
    ẑ_i = Σ_k ω_{k,i} l^k_i. As in the authors' code, wrong clients keep weight 0 *before* the
    softmax, so they still receive a share e^0 / Σ_k e^{w_k}. Entropies are floored at the dtype's
    smallest normal number so that a one-hot prediction gets a large finite weight instead of 1/0.

    Args:
        client_logits: (K, B, J) raw logits of the K clients.
        labels: (B,) true labels.

    Returns:
        (B, J) ensembled raw logits (no gradient).
    """
    _check_uploads(client_logits)
    logits = client_logits.detach()
    correct = logits.argmax(dim=-1) == labels.to(logits.device).unsqueeze(0)
    h = entropy(torch.softmax(logits, dim=-1)).clamp_min(torch.finfo(logits.dtype).tiny)
    weight = torch.where(correct, 1.0 / h, torch.zeros_like(h))
    omega = torch.softmax(weight, dim=0)
    return (omega.unsqueeze(-1) * logits).sum(dim=0)


def fedgems_kl(student_logits: Tensor, teacher_logits: Tensor, kl_mode: str) -> Tensor:
    """FedGEMS distillation term between a student's and a teacher's logits (the PLI authors' FedGEMS code).

    ``kl_mode="code"``: the authors' ``nn.KLDivLoss()(log_softmax(teacher), softmax(student))``, i.e.
    mean over all B·J elements of q (ln q − ln p_t) with q = softmax(student): KL(student ‖ teacher)/J
    averaged over rows. ``kl_mode="standard"``: batchmean KL(teacher ‖ student) =
    (1/B) Σ_i Σ_u p_t (ln p_t − ln q). The teacher is detached.

    Args:
        student_logits: (B, J), with gradient.
        teacher_logits: (B, J) server-pool, ensemble or server logits.
        kl_mode: ``"code"`` or ``"standard"``.

    Returns:
        Scalar loss.
    """
    log_t = torch.log_softmax(teacher_logits.detach(), dim=-1)
    log_q = torch.log_softmax(student_logits, dim=-1)
    if kl_mode == "code":
        return (log_q.exp() * (log_q - log_t)).mean()
    if kl_mode == "standard":
        return F.kl_div(log_q, log_t, reduction="batchmean", log_target=True)
    raise ValueError(f"kl_mode must be one of {KL_MODES}, got {kl_mode!r}")


def fedgems_subsets(server_logits: Tensor, labels: Tensor, has_pool: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Split a batch for selective knowledge fusion (the PLI authors' FedGEMS code).

    Returns:
        (B,) bool masks S1 (server correct), S2 (wrong, pool entry exists), S3 (wrong, no pool entry).
    """
    s1 = server_logits.detach().argmax(dim=-1) == labels
    return s1, ~s1 & has_pool, ~s1 & ~has_pool


def fedgems_fusion_loss(
    server_logits: Tensor,
    labels: Tensor,
    pool_logits: Tensor,
    has_pool: Tensor,
    ensemble_logits: Tensor | None,
    epsilon: float,
    kl_mode: str,
) -> tuple[Tensor, Tensor]:
    """FedGEMS server loss on one labeled public batch (the PLI authors' FedGEMS code).

    loss = CE̅(S1) + [ε CE̅(S2) + (1−ε) KL(S2; pool)] + [ε CE̅(S3) + (1−ε) KL(S3; ensemble)],

    where CE̅(S) is the cross-entropy averaged over the rows of subset S, KL is :func:`fedgems_kl` on
    those rows, and a term is dropped when its subset is empty. This is the authors' reduction (one mean
    per subset, then a sum), so a subset's weight does not depend on its size.

    Args:
        server_logits: (B, J) server outputs z, with gradient.
        labels: (B,) true labels in [0, J).
        pool_logits: (B, J) global-pool logits of the rows (read only where ``has_pool``).
        has_pool: (B,) bool, whether the row has a pool entry.
        ensemble_logits: (B, J) :func:`fedgems_ensemble` output (read only on S3 rows); may be ``None``
            when no row is in S3.
        epsilon: ε, weight of CE against KL (0.75 in PLI).
        kl_mode: ``"code"`` or ``"standard"`` (see :func:`fedgems_kl`).

    Returns:
        (scalar loss, (B,) bool S1 mask): the caller stores ``server_logits.detach()[s1]`` in the pool.
        S2 and S3 are ``~s1 & has_pool`` and ``~s1 & ~has_pool`` (:func:`fedgems_subsets`).
    """
    s1, s2, s3 = fedgems_subsets(server_logits, labels, has_pool)
    loss = server_logits.new_zeros(())
    if s1.any():
        loss = loss + F.cross_entropy(server_logits[s1], labels[s1])
    for subset, teacher in ((s2, pool_logits), (s3, ensemble_logits)):
        if not subset.any():
            continue
        if teacher is None:
            raise ValueError("fedgems_fusion_loss: ensemble_logits is required when the server is wrong on rows without a pool entry (S3)")
        z = server_logits[subset]
        loss = loss + epsilon * F.cross_entropy(z, labels[subset]) + (1.0 - epsilon) * fedgems_kl(z, teacher[subset], kl_mode)
    return loss, s1


# ---------------------------------------------------------------------------------------------- Cronus
_CHUNK_ELEMENTS = 1 << 22


def _filter_slack(eps: float, tau: float, dim: int) -> float:
    """The term ε / (M ln(M ε / τ)) of the stopping rule; +inf where the log is 0 (MATLAB's x/0)."""
    log = math.log(dim * eps / tau)
    return math.inf if log == 0 else eps / (dim * log)


def _top_eigpair(centered: Tensor) -> tuple[Tensor, Tensor]:
    """Top eigenpair of Σ = Cᵀ C for a batch C of shape (S, n, M); returns λ (S,) and unit v (S, M).

    Uses the smaller of Σ (M×M) and the Gram matrix C Cᵀ (n×n); for the latter v = Cᵀ u / √λ.
    """
    n, m = centered.shape[-2:]
    if m <= n:
        values, vectors = torch.linalg.eigh(centered.transpose(-1, -2) @ centered)
        return values[:, -1], vectors[:, :, -1]
    values, vectors = torch.linalg.eigh(centered @ centered.transpose(-1, -2))
    lam = values[:, -1]
    v = (centered.transpose(-1, -2) @ vectors[:, :, -1:]).squeeze(-1) / lam.clamp_min(1e-300).sqrt().unsqueeze(-1)
    return lam, v


def _filter_batch(X: Tensor, eps: float, tau: float, cher: float) -> tuple[Tensor, Tensor]:
    """Run :func:`diakonikolas_filter` on S independent point sets at once: X (S, n, M) float64.

    Each pass works only on the sets still being filtered; sets whose eigenvalue test passes are done.
    """
    s_count, n, m = X.shape
    threshold = 1.0 + 3.0 * eps * math.log(1.0 / eps)
    slack = _filter_slack(eps, tau, m)
    delta = 2.0 * eps
    kept = torch.ones(s_count, n, dtype=torch.bool, device=X.device)
    active = torch.arange(s_count, device=X.device)
    rank = torch.arange(1, n + 1, device=X.device, dtype=X.dtype)
    while active.numel():
        x, mask = X[active], kept[active]
        count = mask.sum(dim=1)
        w = mask.to(X.dtype).unsqueeze(-1)
        mu = (x * w).sum(dim=1) / count.unsqueeze(-1)
        lam, v = _top_eigpair((x - mu.unsqueeze(1)) * w / count.sqrt().view(-1, 1, 1))
        fire = lam >= threshold
        if not fire.any():
            break
        active, x, mask, count, v = active[fire], x[fire], mask[fire], count[fire], v[fire]
        proj = (x @ v.unsqueeze(-1)).squeeze(-1)
        ordered = proj.masked_fill(~mask, math.inf).sort(dim=1).values
        median = (ordered.gather(1, ((count - 1) // 2).unsqueeze(1)) + ordered.gather(1, (count // 2).unsqueeze(1))) / 2
        sorted_score, order = (proj - median).abs().masked_fill(~mask, math.inf).sort(dim=1, stable=True)
        cnt = count.unsqueeze(1).to(X.dtype)
        tail = torch.special.erfc((sorted_score - delta) / math.sqrt(2.0)) / 2.0
        hits = ((cnt - rank) > cher * cnt * (tail + slack)) & (rank <= cnt)
        first = hits.to(torch.uint8).argmax(dim=1) + 1
        go = hits.any(dim=1) & (first > 1) & (first < count)
        if not go.any():
            break
        active, order, first = active[go], order[go], first[go]
        new_mask = torch.zeros(active.numel(), n, dtype=torch.bool, device=X.device)
        kept[active] = new_mask.scatter_(1, order, rank.unsqueeze(0) <= first.unsqueeze(1).to(X.dtype))
    w = kept.to(X.dtype).unsqueeze(-1)
    return (X * w).sum(dim=1) / kept.sum(dim=1, keepdim=True).to(X.dtype), kept


def diakonikolas_filter(X: Tensor, eps: float, tau: float, cher: float = 2.5) -> tuple[Tensor, Tensor]:
    """Iterative filter for robust mean estimation (Diakonikolas et al.; Cronus's aggregation, Shi et al., PoPETs 2025, §2.1).

    Repeat on the points still kept (n of them, dimension M):
    μ = mean; (λ, v) = top eigenpair of Σ = (X−μ)ᵀ(X−μ)/n; stop and return μ if λ < 1 + 3ε ln(1/ε);
    s = sorted |X v − median(X v)| ascending; δ = 2ε; find the first 1-based i with
    n − i > cher·n·(erfc((s_(i) − δ)/√2)/2 + ε/(M ln(M ε/τ))); keep the i points with the smallest
    scores. Deviations from the textbook pseudo-code, which follow the reference MATLAB
    ``filterGaussianMean.m`` (hoonose/robust-filter): the filter also stops (returning μ) when no i
    qualifies or when i = 1 or i = n (that loop would not terminate when nothing is removed);
    exactly i points are kept (ties broken by index, not by the ``proj <= s_(i)`` test); the median of
    an even count is the mean of the two middle values (MATLAB ``median``). The eigenvalue test assumes
    identity covariance; points on the probability simplex have trace(Σ) < 1, so it never fires on them and
    Cronus uploads always get the plain mean. On unit-scale data with n ≲ 10·M the test fires on honest
    points too, and a single outlier among few points is removed only if the largest honest score s
    satisfies 1 > cher·n·(Q(s − δ) + slack) (about s > 2 at n = 10, M = 10).

    Args:
        X: (n, M) points.
        eps: assumed corrupted fraction ε in (0, 1) (0.1 by default: PDA-FD gives no value).
        tau: confidence τ > 0 (0.1).
        cher: the Chernoff constant of the stopping rule (2.5 in the reference code).

    Returns:
        (M,) estimated mean (dtype of X) and (n,) bool mask of the points kept.
    """
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"X must have shape (n, M) with n >= 1, got {tuple(X.shape)}")
    _check_filter_args(eps, tau)
    mean, kept = _filter_batch(X.detach().double().unsqueeze(0), eps, tau, cher)
    return mean[0].to(X.dtype), kept[0]


def _check_filter_args(eps: float, tau: float) -> None:
    if not 0.0 < eps < 1.0:
        raise ValueError(f"robust-mean eps must be in (0, 1), got {eps}")
    if tau <= 0.0:
        raise ValueError(f"robust-mean tau must be > 0, got {tau}")


def robust_mean(uploads: Tensor, eps: float, tau: float, cher: float = 2.5) -> tuple[Tensor, Tensor]:
    """Cronus aggregation: :func:`diakonikolas_filter` on each public sample's K uploads (Shi et al., PoPETs 2025, §2.1).

    Samples are filtered together in batched float64 linear algebra, in chunks of about 2^22 elements;
    each iteration only touches the samples whose eigenvalue test still fires.

    Args:
        uploads: (K, N, J) client probability vectors.
        eps, tau, cher: as in :func:`diakonikolas_filter`.

    Returns:
        (N, J) robust means (dtype of ``uploads``) and (N,) int64 number of uploads filtered out per sample.
    """
    _check_uploads(uploads)
    _check_filter_args(eps, tau)
    k, _, j = uploads.shape
    per_sample = uploads.detach().transpose(0, 1)
    chunks = [_filter_batch(chunk.double(), eps, tau, cher) for chunk in per_sample.split(max(1, _CHUNK_ELEMENTS // (k * j)))]
    mean = torch.cat([m for m, _ in chunks]).to(uploads.dtype)
    kept = torch.cat([kept for _, kept in chunks])
    return mean, k - kept.sum(dim=1)


# ---------------------------------------------------------------------------------------------- FedAvg
def fedavg(states: list[dict[str, Tensor]], weights: list[float]) -> dict[str, Tensor]:
    """FedAvg aggregation ω = Σ_k (n_k / n) ω^k over every state-dict entry (Wu et al., ICLR 2024, §2.1; buffers as below).

    Floating tensors (parameters, BatchNorm running statistics) take the weighted mean, computed in float64
    and cast back; other tensors (``num_batches_tracked``) take the element-wise max. A leading ``module.``
    is stripped from every key (DDP / DataParallel state dicts).

    Args:
        states: the K client state dicts, with the same keys after stripping.
        weights: K non-negative weights (e.g. n_k), normalised by their sum.

    Returns:
        The aggregated state dict, keys in the order of the first state.
    """
    if not states or len(states) != len(weights):
        raise ValueError(f"fedavg needs one weight per state, got {len(states)} states and {len(weights)} weights")
    total = float(sum(weights))
    if any(w < 0 for w in weights) or total <= 0:
        raise ValueError(f"fedavg weights must be non-negative with a positive sum, got {weights}")
    stripped = [{key.removeprefix("module."): value for key, value in state.items()} for state in states]
    keys = list(stripped[0])
    for k, state in enumerate(stripped[1:], start=1):
        if set(state) != set(keys):
            diff = sorted(set(state) ^ set(keys))
            raise ValueError(f"fedavg: state {k} has different keys from state 0: {diff[:5]}")
    out: dict[str, Tensor] = {}
    for key in keys:
        tensors = [state[key] for state in stripped]
        if tensors[0].is_floating_point():
            acc = sum((w / total) * t.double() for w, t in zip(weights, tensors))
            out[key] = acc.to(tensors[0].dtype)  # type: ignore[union-attr]
        else:
            out[key] = torch.stack(tensors).amax(dim=0)
    return out
