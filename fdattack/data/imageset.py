"""In-memory labeled image sets and the indexed-batch contract every loader yields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, TypedDict

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

SENSITIVE = 0  # public sample in the sensitive (private-looking) domain, D_0 in PLI
AUXILIARY = 1  # public sample in the insensitive auxiliary domain, D_a in PLI
UNLABELED = -1  # label of a public sample whose label the protocol does not use


class IndexedBatch(TypedDict):
    """One mini-batch. ``index`` is the row of each sample in its :class:`ImageSet`.

    Shapes: ``index`` (B,), ``x`` (B, C, H, W) float in [-1, 1], ``y`` (B,) int64 (-1 = unlabeled),
    ``domain`` (B,) int64 (0 sensitive, 1 auxiliary). Distillation phases add ``target`` (B, J).
    """

    index: Tensor
    x: Tensor
    y: Tensor
    domain: Tensor


@dataclass
class ImageSet:
    """A labeled image set held in memory.

    Attributes:
        images: (N, C, H, W) float32 in [-1, 1].
        labels: (N,) int64; -1 marks an unlabeled sample.
        domain: (N,) int64; 0 sensitive, 1 auxiliary (public set only; all 0 elsewhere).
        source: (N,) int64 row of each image in the dataset it was cut from (for provenance checks).
    """

    images: Tensor
    labels: Tensor
    domain: Tensor
    source: Tensor

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        for name in ("labels", "domain", "source"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"ImageSet.{name} must have shape ({n},), got {tuple(getattr(self, name).shape)}")

    @classmethod
    def from_images(cls, images: Tensor, labels: Tensor, domain: Tensor | None = None) -> "ImageSet":
        """Build a set whose ``source`` is 0..N-1 and whose domain defaults to sensitive."""
        n = images.shape[0]
        dom = torch.zeros(n, dtype=torch.long) if domain is None else domain.long()
        return cls(images.float(), labels.long(), dom, torch.arange(n))

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.images.shape[1:])  # type: ignore[return-value]

    def copy(self) -> "ImageSet":
        """A copy that shares no tensor with this set."""
        return ImageSet(self.images.clone(), self.labels.clone(), self.domain.clone(), self.source.clone())

    def subset(self, indices: Tensor | list[int]) -> "ImageSet":
        idx = torch.as_tensor(indices, dtype=torch.long)
        return ImageSet(self.images[idx], self.labels[idx], self.domain[idx], self.source[idx])

    def concat(self, other: "ImageSet") -> "ImageSet":
        return ImageSet(
            torch.cat([self.images, other.images]),
            torch.cat([self.labels, other.labels]),
            torch.cat([self.domain, other.domain]),
            torch.cat([self.source, other.source]),
        )

    def batch(self, indices: Tensor) -> IndexedBatch:
        return IndexedBatch(index=indices, x=self.images[indices], y=self.labels[indices], domain=self.domain[indices])

    def loader(self, batch_size: int, shuffle: bool = False, seed: int | None = None, drop_last: bool = False) -> DataLoader:
        """A DataLoader of :class:`IndexedBatch` that slices whole batches at once (no per-item collate)."""
        return _BatchedView(self, None).loader(batch_size, shuffle, seed, drop_last)

    def with_targets(self, targets: Tensor) -> "_BatchedView":
        """A dataset view whose batches carry ``target`` rows aligned with this set's rows."""
        if targets.shape[0] != len(self):
            raise ValueError(f"targets has {targets.shape[0]} rows for {len(self)} samples")
        return _BatchedView(self, targets)


def _identity(batch: IndexedBatch) -> IndexedBatch:
    return batch


class _BatchedView(Dataset):
    """Map-style dataset whose ``__getitems__`` returns one already-collated batch."""

    def __init__(self, images: ImageSet, targets: Tensor | None) -> None:
        self.images = images
        self.targets = targets

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> IndexedBatch:  # single items are rarely used
        return self.__getitems__([i])

    def __getitems__(self, indices: list[int]) -> IndexedBatch:
        idx = torch.as_tensor(indices, dtype=torch.long)
        batch = self.images.batch(idx)
        if self.targets is not None:
            batch["target"] = self.targets[idx]  # type: ignore[typeddict-unknown-key]
        return batch

    def loader(self, batch_size: int, shuffle: bool = False, seed: int | None = None, drop_last: bool = False) -> DataLoader:
        """Shuffling uses its own generator seeded with ``seed``, so a resumed run draws the same batches."""
        generator = None
        if shuffle:
            generator = torch.Generator()
            generator.manual_seed(0 if seed is None else seed)
        return DataLoader(self, batch_size=batch_size, shuffle=shuffle, generator=generator, drop_last=drop_last, collate_fn=_identity)


def iterate_in_order(images: ImageSet, batch_size: int) -> Iterator[IndexedBatch]:
    """Batches in row order, for inference passes (no DataLoader)."""
    for start in range(0, len(images), batch_size):
        yield images.batch(torch.arange(start, min(start + batch_size, len(images))))
