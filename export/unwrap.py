"""Match a checkpoint's keys to the target module's own keys, removing wrapper prefixes wherever they stand.

`module.` (DDP, DataParallel; also mid-key when only a submodule was wrapped), `_orig_mod.`
(torch.compile, in either order with `module.`) and attribute prefixes of any depth (Lightning's `model.`, a
user's `net.backbone.` around a Hugging Face model) are removed only where that turns a key into one the target
module really has: no blind string replacement, so a model that genuinely has a submodule called `module` keeps
it. Whether the result then fits the model exactly is export/provenance.py's check (`load_checked`), never
`strict=False`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations

import torch

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
            for depth in range(1, len(kept)):
                if any(p in WRAPPER_SEGMENTS for p in kept[:depth]):
                    break
                out.append((".".join(kept[depth:]), removed, ".".join(kept[:depth])))
    # Fewest removals first; an attribute prefix only after the wrapper segments, the shallowest first.
    out.sort(key=lambda c: len(c[1]) + (0 if c[2] is None else 1 + 0.5 * c[2].count(".")))
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
        # Beside a one-segment attribute prefix (Lightning's `model.`), keys outside it are the container's own
        # (its loss's weights); beside a deeper one they are the user's wrapper's, part of what was trained.
        bare = ".".join(p for p in key.split(".") if p not in WRAPPER_SEGMENTS)
        container = prefixes and all("." not in p for p in prefixes)
        if container and not any(bare.startswith(p + ".") for p in prefixes):
            result.ignored.append(key)
        else:
            mapped[key] = state[key]  # reported as unexpected by export/provenance.py
    return result
