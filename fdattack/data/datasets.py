"""Dataset registry: each loader turns a :class:`DataConfig` into a :class:`RawDataset` in [-1, 1].

Folder layouts under ``data.root``:

- ``mnist``: ``t10k-images-idx3-ubyte[.gz]`` + ``t10k-labels-idx1-ubyte[.gz]`` and optionally ``train-*``
  (the files torchvision downloads); ``data.download=true`` fetches them with torchvision.
- ``att_faces``: ``s1/1.pgm ... s40/10.pgm`` (AT&T / ORL faces).
- ``image_folder``: one folder per identity ``root/<identity>/*.{jpg,jpeg,png,pgm,bmp}``; an optional second
  (insensitive) look per identity either in a subfolder (LAG: ``root/<id>/y/*.jpg``, set
  ``data.second_look_subdir=y``) or in a parallel tree with the same file names (LFW / masked LFW:
  ``data.root=.../lfw-align-128`` and ``data.second_look_root=.../lfw-align-128-masked``).
- ``cifar10``, ``cifar100``, ``fashion_mnist``, ``celeba``: torchvision's layouts (``data.download=true`` to fetch).
- ``cinic10``: the official CINIC-10 release unpacked, ``root/{train,valid,test}/<class>/*.png`` (32x32 RGB, 90,000
  images per split). ``train`` is the pool, ``test`` the test set; ``valid`` is not read (Shi et al., PoPETs 2025, Table 10).
- ``purchase``: Shokri et al.'s ``root/dataset_purchase`` (tabular; see :mod:`fdattack.data.purchase`).
"""

from __future__ import annotations

import gzip
import struct
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor

from fdattack.errors import ConfigError, DataError
from fdattack.registry import Registry

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".pgm", ".bmp"}


@dataclass
class RawDataset:
    """A labeled image pool before splitting.

    Attributes:
        images: (N, C, H, W) float32 in [-1, 1].
        labels: (N,) int64 in [0, num_labels).
        second_look: (N, C, H, W) insensitive look of the same identity per sample, or None.
        test_images, test_labels: an official test split, or None.
        class_names: a name per label.
    """

    images: Tensor
    labels: Tensor
    second_look: Optional[Tensor] = None
    test_images: Optional[Tensor] = None
    test_labels: Optional[Tensor] = None
    class_names: list[str] = field(default_factory=list)

    @property
    def num_labels(self) -> int:
        return int(self.labels.max()) + 1


DATASETS: Registry[Callable[[DictConfig], RawDataset]] = Registry("dataset", "data.name")


def to_unit_range(images_uint8: Tensor | np.ndarray, max_value: float = 255.0) -> Tensor:
    """Pixel values in [0, max_value] → float32 in [-1, 1] (ToTensor then Normalize(0.5, 0.5))."""
    x = torch.as_tensor(np.array(images_uint8), dtype=torch.float32) / max_value
    return x * 2.0 - 1.0


def resize(images: Tensor | None, size: int | None) -> Tensor | None:
    """Square bilinear resize with antialiasing; None size keeps the images."""
    if images is None or size is None or images.shape[-1] == size and images.shape[-2] == size:
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", antialias=True, align_corners=False).clamp(-1, 1)


def _root(cfg: DictConfig) -> Path:
    if cfg.root is None:
        raise ConfigError(f"data.name={cfg.name} needs data.root (the folder holding its files)")
    root = Path(cfg.root).expanduser()
    if not root.is_dir():
        raise DataError(f"data.root={cfg.root!r}: folder not found")
    return root


# ------------------------------------------------------------------------------------------- digits
@DATASETS.register("digits")
def load_digits_dataset(cfg: DictConfig) -> RawDataset:
    """scikit-learn's 1,797 8x8 digits (values 0..16)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = to_unit_range(d.images[:, None], max_value=16.0)
    return RawDataset(resize(images, cfg.image_size), torch.as_tensor(d.target, dtype=torch.long), class_names=[str(i) for i in range(10)])


# ------------------------------------------------------------------------------------------- MNIST IDX
def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (optionally gzipped): uint8 arrays of images (magic 2051) or labels (2049)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path) as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:  # gzip raises zlib.error for a corrupt deflate stream
        raise DataError(f"{path}: unreadable, corrupt or truncated IDX file ({err})") from None
    if len(raw) < 8:
        raise DataError(f"{path}: truncated IDX file ({len(raw)} bytes)")
    magic, count = struct.unpack(">II", raw[:8])
    if magic == 2049:
        header, shape = 8, (count,)
    elif magic == 2051:
        if len(raw) < 16:
            raise DataError(f"{path}: truncated IDX header")
        rows, cols = struct.unpack(">II", raw[8:16])
        header, shape = 16, (count, rows, cols)
    else:
        raise DataError(f"{path}: not an MNIST IDX file (magic number {magic})")
    expected = header + int(np.prod(shape))
    if len(raw) != expected:
        raise DataError(f"{path}: corrupt IDX file ({len(raw)} bytes, expected {expected})")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape).copy()


def _find(root: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (root / name).is_file():
            return root / name
    return None


@DATASETS.register("mnist")
def load_mnist(cfg: DictConfig) -> RawDataset:
    """MNIST from IDX files; with only the t10k files present they are the pool."""
    if cfg.root is None or cfg.download:
        return _torchvision_dataset(cfg, "MNIST")
    root = _root(cfg)
    parts = {}
    for split in ("train", "t10k"):
        img, lab = _find(root, f"{split}-images-idx3-ubyte"), _find(root, f"{split}-labels-idx1-ubyte")
        if img and lab:
            images, labels = read_idx(img), read_idx(lab)
            if len(images) != len(labels):
                raise DataError(f"{img}: {len(images)} images but {lab.name} has {len(labels)} labels")
            parts[split] = (to_unit_range(images[:, None]), torch.as_tensor(labels.astype(np.int64)))
    if not parts:
        raise DataError(f"{root}: no MNIST IDX files (expected t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz])")
    pool = parts.get("train", parts.get("t10k"))
    test = parts.get("t10k") if "train" in parts else None
    return RawDataset(
        resize(pool[0], cfg.image_size),
        pool[1],  # type: ignore[index]
        test_images=None if test is None else resize(test[0], cfg.image_size),
        test_labels=None if test is None else test[1],
        class_names=[str(i) for i in range(10)],
    )


# ------------------------------------------------------------------------------------------- faces
def read_image(path: Path, channels: int) -> np.ndarray:
    """One image file as uint8 (H, W, C); a corrupt file is a DataError naming it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # a header declaring a huge image
            with Image.open(path) as im:
                im = im.convert("L" if channels == 1 else "RGB")
                im.load()
                arr = np.asarray(im)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise DataError(f"{path}: corrupt or unreadable image ({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
    return arr[:, :, None] if arr.ndim == 2 else arr


def _stack(arrays: list[np.ndarray], paths: list[Path], size: int | None) -> Tensor:
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1 and size is None:
        raise DataError(f"{paths[0].parent.parent}: images have different sizes {sorted(shapes)[:3]}; set data.image_size")
    if len(shapes) == 1:  # one conversion for the whole stack (CINIC-10's 180,000 images); the same values
        return resize(to_unit_range(np.stack(arrays)).permute(0, 3, 1, 2).contiguous(), size)  # type: ignore[return-value]
    tensors = [resize(to_unit_range(a).permute(2, 0, 1)[None], size)[0] for a in arrays]  # type: ignore[index]
    return torch.stack(tensors)


@DATASETS.register("att_faces")
def load_att_faces(cfg: DictConfig) -> RawDataset:
    """AT&T faces: ``root/sN/*.pgm`` (40 subjects x 10 images, 92x112 grayscale)."""
    root = _root(cfg)
    subjects = sorted(
        (p for p in root.iterdir() if p.is_dir() and p.name.startswith("s") and p.name[1:].isdigit()), key=lambda p: int(p.name[1:])
    )
    if not subjects:
        raise DataError(f"{root}: no subject folders s1, s2, ... holding .pgm files (the AT&T faces layout)")
    if cfg.max_classes is not None:  # the subjects with the most images, first in folder order on ties, kept in that order
        by_size = sorted(range(len(subjects)), key=lambda i: (-len(list(subjects[i].glob("*.pgm"))), i))[: cfg.max_classes]
        subjects = [subjects[i] for i in sorted(by_size)]
    arrays, labels, paths = [], [], []
    for label, folder in enumerate(subjects):
        files = sorted(folder.glob("*.pgm"), key=lambda p: (len(p.stem), p.stem))
        if not files:
            raise DataError(f"{folder}: no .pgm images")
        for f in files:
            arrays.append(read_image(f, 1))
            labels.append(label)
            paths.append(f)
    return RawDataset(_stack(arrays, paths, cfg.image_size), torch.as_tensor(labels), class_names=[s.name for s in subjects])


@DATASETS.register("image_folder")
def load_image_folder(cfg: DictConfig) -> RawDataset:
    """One folder per identity, RGB; optional second look (``second_look_subdir`` or ``second_look_root``)."""
    root = _root(cfg)
    second_root = Path(cfg.second_look_root).expanduser() if cfg.second_look_root else None
    if second_root is not None and not second_root.is_dir():
        raise DataError(f"data.second_look_root={cfg.second_look_root!r}: folder not found")
    entries: list[tuple[str, list[Path]]] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if second_root is not None:
            files = [f for f in files if (second_root / folder.name / f.name).is_file()]
        if files:
            entries.append((folder.name, files))
    if not entries:
        raise DataError(f"{root}: no identity folders with images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    if cfg.max_classes is not None:
        entries = sorted(entries, key=lambda e: (-len(e[1]), e[0]))[: cfg.max_classes]
        entries.sort(key=lambda e: e[0])
    arrays, looks, labels, paths = [], [], [], []
    for label, (name, files) in enumerate(entries):
        subdir_looks = (
            sorted(p for p in (root / name / cfg.second_look_subdir).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if cfg.second_look_subdir and (root / name / cfg.second_look_subdir).is_dir()
            else []
        )
        for i, f in enumerate(files):
            arrays.append(read_image(f, 3))
            paths.append(f)
            labels.append(label)
            if second_root is not None:
                looks.append(read_image(second_root / name / f.name, 3))
            elif cfg.second_look_subdir:
                if not subdir_looks:
                    raise DataError(f"{root / name / cfg.second_look_subdir}: no second-look images for identity {name}")
                looks.append(read_image(subdir_looks[i % len(subdir_looks)], 3))
    images = _stack(arrays, paths, cfg.image_size)
    second = _stack(looks, paths, cfg.image_size or images.shape[-1]) if looks else None
    return RawDataset(images, torch.as_tensor(labels), second_look=second, class_names=[n for n, _ in entries])


@DATASETS.register("cinic10")
def load_cinic10(cfg: DictConfig) -> RawDataset:
    """CINIC-10 (Shi et al., PoPETs 2025, Table 10): ``root/train/<class>/*.png`` is the pool (90,000),
    ``root/test/<class>/*.png`` the test set (90,000); both RGB, ``ToTensor`` + ``Normalize(0.5, 0.5)`` (as the PDA-FD
    code does for CIFAR). Labels follow the sorted class folders of ``train``, which ``test`` must repeat; ``valid`` is
    not read."""
    root = _root(cfg)
    layout = "root/{train,valid,test}/<class>/*.png"
    train = root / "train"
    if not train.is_dir():
        raise DataError(f"{train}: folder not found (CINIC-10 layout: {layout})")
    classes = sorted(p.name for p in train.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{train}: no class folders (CINIC-10 layout: {layout})")

    def split(name: str) -> tuple[Tensor, Tensor]:
        arrays, labels, paths = [], [], []
        for label, cls in enumerate(classes):
            folder = root / name / cls
            files = sorted(folder.glob("*.png")) if folder.is_dir() else []
            if not files:
                raise DataError(f"{folder}: {'no .png images' if folder.is_dir() else 'folder not found'} (CINIC-10 layout: {layout})")
            arrays.extend(read_image(f, 3) for f in files)
            labels.extend([label] * len(files))
            paths.extend(files)
        return _stack(arrays, paths, cfg.image_size), torch.as_tensor(labels)

    images, labels = split("train")
    test_images, test_labels = split("test")
    return RawDataset(images, labels, test_images=test_images, test_labels=test_labels, class_names=classes)


# ------------------------------------------------------------------------------------------- torchvision
def _torchvision_dataset(cfg: DictConfig, cls_name: str) -> RawDataset:
    import torchvision

    if cfg.root is None:
        raise ConfigError(f"data.name={cfg.name} needs data.root (where torchvision keeps it)")
    cls = getattr(torchvision.datasets, cls_name)

    def load(train: bool) -> tuple[Tensor, Tensor]:
        try:
            if cls_name == "CelebA":
                ds = cls(cfg.root, split="train" if train else "test", target_type="identity", download=cfg.download)
            else:
                ds = cls(cfg.root, train=train, download=cfg.download)
        except RuntimeError as err:
            raise DataError(
                f"data.root={cfg.root!r}: {cls_name} not found there ({str(err).splitlines()[0]}); set data.download=true to fetch it"
            ) from None
        if hasattr(ds, "data") and not isinstance(ds.data, list):
            data = np.asarray(ds.data)
            data = data[:, None] if data.ndim == 3 else data.transpose(0, 3, 1, 2)
            labels = torch.as_tensor(np.asarray(ds.targets), dtype=torch.long)
            return to_unit_range(data), labels
        xs, ys = zip(*(ds[i] for i in range(len(ds))))
        arr = np.stack([np.asarray(x) for x in xs]).transpose(0, 3, 1, 2)
        return to_unit_range(arr), torch.as_tensor([int(y) for y in ys]) - (1 if cls_name == "CelebA" else 0)

    x, y = load(True)
    tx, ty = load(False)
    return RawDataset(resize(x, cfg.image_size), y, test_images=resize(tx, cfg.image_size), test_labels=ty)  # type: ignore[arg-type]


for _name, _cls in (("cifar10", "CIFAR10"), ("cifar100", "CIFAR100"), ("fashion_mnist", "FashionMNIST"), ("celeba", "CelebA")):
    DATASETS.register(_name)(lambda cfg, _cls=_cls: _torchvision_dataset(cfg, _cls))


# ------------------------------------------------------------------------------------------- synthetic
@DATASETS.register("synthetic")
def load_synthetic(cfg: DictConfig) -> RawDataset:
    """Class-structured images: each class a distinct smooth pattern, plus noise; learnable by a small CNN."""
    g = torch.Generator().manual_seed(0 if cfg.seed is None else int(cfg.seed))
    c, s, n = cfg.synthetic_channels, cfg.synthetic_image_size, cfg.synthetic_per_class
    coords = torch.linspace(-1, 1, s)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    images, labels = [], []
    for label in range(cfg.synthetic_num_classes):
        freq = 1 + torch.rand(2, generator=g) * 3
        phase = torch.rand(c, 1, 1, generator=g) * 6.283
        pattern = torch.sin(freq[0] * 3.1416 * xx + phase) * torch.cos(freq[1] * 3.1416 * yy + phase)
        noise = 0.3 * torch.randn(n, c, s, s, generator=g)
        images.append((0.7 * pattern + noise).clamp(-1, 1))
        labels.append(torch.full((n,), label))
    return RawDataset(resize(torch.cat(images), cfg.image_size), torch.cat(labels))  # type: ignore[arg-type]
