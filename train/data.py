"""Datasets, samplers and loaders.

Two sources, one pipeline: an ImageFolder tree (`DIR/train`, `DIR/val`, the ImageNet example's layout),
or the embedded default, scikit-learn's handwritten digits, served as RGB PIL images exactly as an
ImageFolder would serve its files.

Exact resume is designed in here rather than bolted on: each sample's augmentation is seeded by
(seed, epoch, index), and the training sampler can start part-way through an epoch's permutation, so a
run resumed at any step, with any number of workers or ranks, sees the same remaining samples with the
same augmentations.
"""

from __future__ import annotations

import math
import os
import signal
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler, Subset
from torchvision import datasets
from torchvision.datasets.folder import IMG_EXTENSIONS

from contract.preprocessing import Preprocessing, check_image_size
from train.class_names import check_class_names
from train.models import eval_defaults, is_timm
from train.presets import eval_transform, train_transform

DEFAULT_IMAGE_SIZE = 32  # torchvision models, when --image-size is not given
DIGITS_VAL_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0  # fixed, independent of --seed: the val set never changes between runs


class DigitsDataset(Dataset):
    """scikit-learn's 8x8 handwritten digits (1,797 real images) as RGB PIL images, ImageFolder-style."""

    def __init__(self, images: np.ndarray, targets: np.ndarray, transform: Any = None) -> None:
        self.images = images
        self.targets = [int(t) for t in targets]
        self.classes = [str(i) for i in range(10)]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = Image.fromarray(self.images[index]).convert("RGB")
        if self.transform is not None:
            image = self.transform(image)
        return image, self.targets[index]


def digits_split() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The deterministic, stratified train/val split of the digits, as uint8 images (0..255)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    x_train, x_val, y_train, y_val = train_test_split(
        images, digits.target, test_size=DIGITS_VAL_FRACTION, stratify=digits.target, random_state=DIGITS_SPLIT_SEED
    )
    return (x_train, y_train), (x_val, y_val)


class SeededAugmentation(Dataset):
    """Seeds the RNG of each sample's transform from (seed, epoch, index), then restores it.

    A resumed run then draws the same crops and flips as an uninterrupted one, whatever the
    worker count or world size, without having to capture the RNG of every DataLoader worker.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        sample_seed = ((self.seed * 1_000_003 + self.epoch) * 10_000_019 + index) % (2**63)
        # The CPU generator the transforms draw from, seeded and restored directly: torch.manual_seed and
        # fork_rng also reach every other device's generator and record a Python stack for lazy CUDA
        # seeding, about 0.6 ms per sample on this CPU (0.4 s of every digits epoch in the main process).
        generator = torch.default_generator
        state = generator.get_state()
        generator.manual_seed(sample_seed)
        try:
            return self.dataset[index]
        finally:
            generator.set_state(state)


class ResumableDistributedSampler(Sampler[int]):
    """DistributedSampler that can start an epoch after `start` samples of its global permutation.

    The permutation depends only on (seed, epoch), and `start` counts samples over all ranks, so a
    position saved with one world size is resumed correctly with another.
    """

    def __init__(self, dataset_len: int, num_replicas: int, rank: int, seed: int) -> None:
        self.dataset_len = dataset_len
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return math.ceil((self.dataset_len - self.start) / self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        permutation = torch.randperm(self.dataset_len, generator=generator).tolist()
        remaining = permutation[self.start :]
        # Pad from the head of the permutation, as DistributedSampler does, so every rank gets the same
        # count and a resumed epoch pads with exactly the samples the uninterrupted one would have.
        padding = len(self) * self.num_replicas - len(remaining)
        return iter((remaining + permutation[:padding])[self.rank :: self.num_replicas])


def _ignore_sigterm(worker_id: int) -> None:
    """DataLoader workers share their rank's process group, so a SIGTERM sent to the group reaches them too;
    they leave the decision to the rank (which saves, then exits, taking its workers with it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@dataclass
class DataConfig:
    """Where the images come from and how they are shaped."""

    data: str | None = None  # ImageFolder root with train/ and val/; None: the embedded digits
    arch: str = "resnet18"  # its evaluation defaults (timm's data config for timm/NAME) fill what is not set
    image_size: int | None = None  # side of the square the model sees; None: 32, or timm's input size for timm/NAME
    resize: int | None = None  # eval resize before the center crop; None: image_size (digits) or image_size/crop_pct
    min_scale: float | None = None  # RandomResizedCrop lower scale; None: 0.5 (digits) or 0.08 (ImageFolder)
    hflip: float | None = None  # horizontal flip probability; None: 0 (digits are not symmetric) or 0.5
    batch_size: int = 32  # images per process per step
    workers: int = 2  # DataLoader worker processes per rank; 0 loads in the training process

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"--batch-size={self.batch_size}: must be at least 1")
        if self.workers < 0:
            raise ValueError(f"--workers={self.workers}: must be 0 (load in the training process) or more")
        if self.image_size is not None:
            check_image_size(self.image_size)
        if self.data is not None:
            for split in ("train", "val"):
                if not (Path(self.data) / split).is_dir():
                    raise ValueError(f"--data={self.data}: expected an ImageFolder tree with {split}/ inside")

    @property
    def preprocessing(self) -> Preprocessing:
        defaults = eval_defaults(self.arch)
        size = self.image_size or (defaults.image_size if is_timm(self.arch) else DEFAULT_IMAGE_SIZE)
        # The digits are whole 8x8 frames: resized to the crop, nothing cut off.
        default_resize = size if self.data is None else defaults.resize_for(size)
        return Preprocessing(
            crop=size,
            resize=self.resize or default_resize,
            mean=defaults.mean,
            std=defaults.std,
            interpolation=defaults.interpolation,
        )


@dataclass
class Datasets:
    train: SeededAugmentation
    val: Dataset
    classes: list[str]
    preprocessing: Preprocessing


def regular_image_file(path: str) -> bool:
    """ImageFolder's test for a file it should load: an image extension, and (through links) a regular file. A
    FIFO named *.png would block the loader in open() forever, so it is refused while the folder is scanned."""
    if not path.lower().endswith(IMG_EXTENSIONS):
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise ValueError(f"--data: {path}: cannot be read ({err.strerror}); remove it or fix the link") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"--data: {path} is not a regular file (a FIFO, device, socket or folder); remove it")
    if os.stat(path).st_size == 0:  # would fail the epoch it is drawn in, on whichever rank draws it
        raise ValueError(f"--data: {path} is empty (0 bytes); remove it or copy it again")
    return True


def build_datasets(cfg: DataConfig, seed: int) -> Datasets:
    pre = cfg.preprocessing
    embedded = cfg.data is None
    min_scale = cfg.min_scale if cfg.min_scale is not None else (0.5 if embedded else 0.08)
    hflip = cfg.hflip if cfg.hflip is not None else (0.0 if embedded else 0.5)
    augment, evaluate = train_transform(pre, min_scale, hflip), eval_transform(pre)
    if embedded:
        (x_train, y_train), (x_val, y_val) = digits_split()
        train_set: Any = DigitsDataset(x_train, y_train, augment)
        val_set: Any = DigitsDataset(x_val, y_val, evaluate)
    else:
        root = Path(cfg.data)  # type: ignore[arg-type]
        train_set = datasets.ImageFolder(str(root / "train"), augment, is_valid_file=regular_image_file)
        val_set = datasets.ImageFolder(str(root / "val"), evaluate, is_valid_file=regular_image_file)
        if train_set.classes != val_set.classes:
            raise ValueError(f"--data={cfg.data}: train/ and val/ hold different class folders")
        check_class_names(train_set.classes, f"--data={cfg.data}: the class folders")
    return Datasets(SeededAugmentation(train_set, seed), val_set, list(train_set.classes), pre)


def build_loaders(
    ds: Datasets, cfg: DataConfig, rank: int, world_size: int, seed: int, pin_memory: bool
) -> tuple[DataLoader, ResumableDistributedSampler, DataLoader]:
    batch_size, workers = cfg.batch_size, cfg.workers
    if len(ds.train) < batch_size * world_size:
        raise ValueError(
            f"the training set has {len(ds.train)} images, fewer than one step needs "
            f"(--batch-size {batch_size} x {world_size} processes)"
        )
    sampler = ResumableDistributedSampler(len(ds.train), world_size, rank, seed)
    common: dict[str, Any] = dict(
        batch_size=batch_size, num_workers=workers, pin_memory=pin_memory, worker_init_fn=_ignore_sigterm
    )
    # drop_last: a final batch of one image would break BatchNorm in training mode.
    train_loader = DataLoader(ds.train, sampler=sampler, drop_last=True, **common)
    # Validation shards without padding, so the summed counts cover each image exactly once.
    val_shard = Subset(ds.val, range(rank, len(ds.val), world_size))  # type: ignore[arg-type]
    val_loader = DataLoader(val_shard, shuffle=False, **common)
    return train_loader, sampler, val_loader
