"""Match a checkpoint's keys to the target module's own keys, removing wrapper prefixes wherever they stand.

`module.` (DDP, DataParallel; also mid-key when only a submodule was wrapped), `_orig_mod.`
(torch.compile, in either order with `module.`) and an attribute prefix such as Lightning's `model.`
are removed only where that turns a key into one the target module really has: no blind string
replacement, so a model that genuinely has a submodule called `module` keeps it.

Then a strict load (never `strict=False`), with a short readable diff when it does not fit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations

import torch
import torch.nn as nn

WRAPPER_SEGMENTS = ("module", "_orig_mod")


class LoadMismatch(Exception):
    """The weights do not fit the model; the message is the readable diff."""


@dataclass
class Unwrapped:
    state_dict: dict[str, torch.Tensor]
    removed: list[str] = field(default_factory=list)  # e.g. ["module.", "_orig_mod.", "model. (attribute prefix)"]
    ignored: list[str] = field(default_factory=list)  # keys outside the model's attribute prefix (Lightning extras)


def _candidates(key: str) -> list[tuple[str, tuple[str, ...], str | None]]:
    """(new key, wrapper segments removed, attribute prefix removed), fewest removals first."""
    parts = key.split(".")
    positions = [i for i, part in enumerate(parts) if part in WRAPPER_SEGMENTS]
    out: list[tuple[str, tuple[str, ...], str | None]] = []
    for count in range(len(positions) + 1):
        for drop in combinations(positions, count):
            kept = [p for i, p in enumerate(parts) if i not in drop]
            removed = tuple(parts[i] for i in drop)
            out.append((".".join(kept), removed, None))
            if len(kept) > 1 and kept[0] not in WRAPPER_SEGMENTS:
                out.append((".".join(kept[1:]), removed, kept[0]))
    # Fewest removals first; an attribute prefix only after the wrapper segments have been tried.
    out.sort(key=lambda c: len(c[1]) + (1.5 if c[2] is not None else 0))
    return out


def unwrap_keys(state: dict[str, torch.Tensor], target_keys: set[str]) -> Unwrapped:
    mapped: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    wrappers: Counter[str] = Counter()
    prefixes: Counter[str] = Counter()
    unmatched: list[str] = []
    for key, tensor in state.items():
        match = next((c for c in _candidates(key) if c[0] in target_keys), None)
        if match is None:
            unmatched.append(key)
            continue
        new_key, removed, prefix = match
        if new_key in mapped:
            raise LoadMismatch(f"both {origin[new_key]!r} and {key!r} map onto {new_key!r}: ambiguous checkpoint")
        mapped[new_key], origin[new_key] = tensor, key
        wrappers.update(removed)
        if prefix:
            prefixes[prefix] += 1
    result = Unwrapped(mapped, removed=[f"{w}." for w in WRAPPER_SEGMENTS if wrappers[w]])
    result.removed += [f"{p}. (attribute prefix)" for p in prefixes]
    for key in unmatched:
        # With an attribute prefix (Lightning's `model.`), keys outside it belong to the container, not the model.
        if prefixes and key.split(".")[0] not in prefixes:
            result.ignored.append(key)
        else:
            mapped[key] = state[key]  # reported as unexpected by the strict load
    return result


def strict_load(model: nn.Module, state: dict[str, torch.Tensor], arch_hint: str) -> None:
    """`load_state_dict(strict=True)`, preceded by a diff a person can read when it would fail."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        lines = [f"the weights do not fit {arch_hint}:"]
        for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)):
            if items:
                shown = ", ".join(items[:4]) + (f", ... ({len(items)} in all)" if len(items) > 4 else "")
                lines.append(f"  {title}: {shown}")
        lines.append("  hint: did you pass the right --arch (or --model)? Wrapper prefixes were already removed.")
        raise LoadMismatch("\n".join(lines))
    model.load_state_dict(state, strict=True)
