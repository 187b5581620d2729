"""How requests share a batch (serve/model/batching.py): which rows may be joined, how they are joined, and how a
batch's outputs are cut back into each caller's rows. SameShape is the default; a task may bring its own BatchShape
(serve/tasks/texts.py pads token sequences, serve/tasks/images.py runs each image alone)."""

from __future__ import annotations

import itertools
from typing import Protocol

import numpy as np

Rows = np.ndarray | dict[str, np.ndarray]  # a classifier's one input, or any model's inputs by name


def rows_in(rows: Rows) -> int:
    """How many rows (the batch dimension) `rows` holds."""
    return len(rows) if isinstance(rows, np.ndarray) else len(next(iter(rows.values())))


class SameShape:
    """How requests share a batch by default: only where every input agrees beyond the batch dimension (shape and
    dtype), joined as they are. serve/tasks/texts.py's PaddedSequences is the other way: any length,
    padded."""

    def key(self, rows: Rows) -> tuple:
        arrays = {"": rows} if isinstance(rows, np.ndarray) else rows
        return tuple((name, a.shape[1:], a.dtype.str) for name, a in sorted(arrays.items()))

    def join(self, parts: list[Rows]) -> Rows:
        if isinstance(parts[0], np.ndarray):
            return np.concatenate(parts)  # type: ignore[arg-type]
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def fits(self, parts: list[Rows], more: Rows) -> bool:
        """Whether `more` may join a batch of `parts` (the batch size is checked besides)."""
        return True

    def groups(self, parts: list[Rows]) -> list[list[int]]:
        """How one batch's parts (by index) go to the model: here in one call."""
        return [list(range(len(parts)))]


class BatchShape(Protocol):
    def key(self, rows: Rows) -> tuple: ...

    def join(self, parts: list[Rows]) -> Rows: ...

    def fits(self, parts: list[Rows], more: Rows) -> bool: ...

    def groups(self, parts: list[Rows]) -> list[list[int]]: ...


def split_rows(outputs: Rows, sizes: list[int]) -> list[Rows]:
    """Each part's rows of a batch's outputs, as views. Sliced here rather than by np.split, which took 18 us
    for a batch of one (a classifier's three outputs), on the model's thread and holding the GIL."""
    if len(sizes) == 1:
        return [outputs]
    bounds = list(itertools.accumulate(sizes, initial=0))
    spans = list(zip(bounds, bounds[1:]))
    if isinstance(outputs, np.ndarray):
        return [outputs[start:end] for start, end in spans]
    return [{name: a[start:end] for name, a in outputs.items()} for start, end in spans]
