"""Several checkpoints of one job (the ImageNet example saves one per node: 3 nodes, 3 files): are they the same
model? Their weights are compared tensor by tensor, exactly, after the wrapper prefixes (`module.`,
`_orig_mod.`) are removed. Identical: the first is exported. Different: exit 2 naming the first tensor that
differs and by how much, unless `--pick N` says which one to export anyway.

    python -m export node0/ckpt.pth node1/ckpt.pth node2/ckpt.pth
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from export.readers import read_source

log = logging.getLogger("export")
WRAPPERS = frozenset({"module", "_orig_mod"})  # DDP/DataParallel and torch.compile


def bare_key(key: str) -> str:
    return ".".join(part for part in key.split(".") if part not in WRAPPERS)


def _weights(path: Path, trust_pickle: bool, ema: bool) -> dict[str, torch.Tensor]:
    source = read_source(path, trust_pickle=trust_pickle, ema=ema)
    state = source.module.state_dict() if source.module is not None else source.state_dict
    return {bare_key(k): v for k, v in state.items()}


def first_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str | None:
    """None when every tensor is identical (names, dtypes, shapes, values); else what differs first."""
    if a.keys() != b.keys():
        only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
        return f"different tensors: only in the first {only_a[:3]}, only in this one {only_b[:3]}"
    for key in a:  # in the first file's order
        x, y = a[key], b[key]
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"{key}: {x.dtype} {list(x.shape)} against {y.dtype} {list(y.shape)}"
        if not torch.equal(x, y):
            gap = (x.double() - y.double()).abs().max().item() if x.is_floating_point() else "values differ"
            return f"{key} differs (max abs difference {gap:.3g})" if isinstance(gap, float) else f"{key}: {gap}"
    return None


def choose_checkpoint(paths: list[Path], pick: int | None, trust_pickle: bool, ema: bool) -> Path:
    """The one checkpoint to export: the only one, the first of identical ones, or `--pick`'s."""
    if pick is not None and not 1 <= pick <= len(paths):
        raise ValueError(f"--pick {pick}: choose 1 to {len(paths)}, one of the checkpoints given")
    if len(paths) == 1:
        return paths[0]
    first = _weights(paths[0], trust_pickle, ema)
    differences = []
    for path in paths[1:]:
        difference = first_difference(first, _weights(path, trust_pickle, ema))
        if difference:
            differences.append(f"{path} differs from {paths[0]}: {difference}")
    if not differences:
        print(f"the {len(paths)} checkpoints hold identical weights ({len(first)} tensors); exporting {paths[0]}")
        return paths[0]
    if pick is None:
        raise ValueError(
            "; ".join(differences)
            + ". DDP keeps every rank's weights identical, so these are not copies of one model (another step, "
            "another run?); export one with --pick N"
        )
    log.warning("%s; exporting --pick %d: %s", "; ".join(differences), pick, paths[pick - 1])
    return paths[pick - 1]
