"""Provenance: proof that the model being exported is the checkpoint's, tensor by tensor.

Parity compares the artifacts with the eager model; it cannot tell whether the eager model holds the checkpoint's
weights or its own random initialisation. This module can. The checkpoint's tensors (wrapper prefixes already
removed, export/unwrap.py) are loaded with `load_checked`, which refuses, in a few readable lines:
- a model tensor the checkpoint does not hold, unless the model itself declares it tied to one it does hold
  (transformers' `_tied_weights_keys` under `tie_word_embeddings`), and a checkpoint tensor the model has no place
  for, or one of another shape;
- a float tensor holding NaN or Inf (training diverged): nothing it computes can be checked.
With `--allow-partial` (a deliberate partial load, a re-initialised head) what was not loaded and what was left
over are recorded instead, and the export says PARTIAL wherever it says what was compared.

Then `trace` reads every parameter and buffer of the model as it will be exported and checks that each one equals
the checkpoint tensor it was loaded from (a tied one: the tensor it shares), and hashes them all: the manifest's
`provenance`, and a line of the printed report.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn as nn

from export.unwrap import LoadMismatch, Unwrapped

SHOWN = 4  # keys named in a one-line refusal, before "... (N in all)"


@dataclass
class Provenance:
    """The manifest's `provenance`: what of the exported model was traced to the checkpoint."""

    model_tensors: int  # parameters and buffers of the exported model (state_dict entries)
    matched: int  # of them, equal to the checkpoint tensor of the same name
    tied: dict[str, str]  # model key -> the checkpoint key it shares (declared by the model)
    checkpoint_tensors: int  # model tensors the checkpoint held (after unwrapping)
    sha256: str  # over the matched tensors: name, dtype, shape and bytes, in name order
    not_loaded: list[str] = field(default_factory=list)  # left at initialisation (--allow-partial only)
    unused: list[str] = field(default_factory=list)  # checkpoint tensors not loaded (--allow-partial only)
    outside_model: list[str] = field(default_factory=list)  # the container's own entries (Lightning extras)
    partial: bool = False
    adapter: dict[str, Any] | None = None  # a LoRA adapter merged into the checkpoint's weights (readers/lora.py)

    @property
    def complete(self) -> bool:
        return not self.not_loaded and not self.unused

    def to_manifest(self) -> dict[str, Any]:
        found = asdict(self)
        for key in ("not_loaded", "unused", "outside_model"):
            found[f"{key}_count"] = len(found[key])
            found[key] = found[key][:50]
        return found | {"pass": self.complete or self.partial, "summary": self.line()}

    def line(self) -> str:
        tied = f", {len(self.tied)} tied as the model declares" if self.tied else ""
        head = (
            f"provenance: {self.matched + len(self.tied)} of {self.model_tensors} model tensors equal the "
            f"checkpoint's{tied}; {self.checkpoint_tensors - len(self.unused)} of {self.checkpoint_tensors} "
            f"checkpoint tensors used; sha256 {self.sha256[:16]}"
        )
        if self.adapter is not None:
            head += (
                f"; LoRA adapter merged: {self.adapter['merged']} weights, {len(self.adapter['replaced'])} replaced "
                f"(all {self.adapter['tensors']} adapter tensors used; sha256 {self.adapter['sha256'][:16]})"
            )
        if self.partial and not self.complete:
            head += (
                f"; PARTIAL (--allow-partial): {len(self.not_loaded)} left at initialisation "
                f"({_named(self.not_loaded)}), {len(self.unused)} unused ({_named(self.unused)})"
            )
        return head


def _named(keys: list[str]) -> str:
    if not keys:
        return "none"
    return ", ".join(keys[:SHOWN]) + (f", ... ({len(keys)} in all)" if len(keys) > SHOWN else "")


def declared_tied(model: nn.Module) -> dict[str, str]:
    """{key: key it is tied to} as the model declares it: transformers' expanded `_tied_weights_keys` when the
    config ties them; nothing for any other module (a weight shared in code is saved under both names)."""
    expand: Any = getattr(model, "get_expanded_tied_weights_keys", None)
    if expand is None:
        return {}
    pairs = dict(expand(all_submodels=True))
    return pairs | {source: target for target, source in pairs.items()}  # either one may be the one saved


def load_checked(
    model: nn.Module, unwrapped: Unwrapped, what: str, allow_partial: bool = False
) -> tuple[set[str], dict[str, str]]:
    """Load the checkpoint's tensors into `model` (module docstring); (the keys loaded, the tied ones
    {model key: checkpoint key}). LoadMismatch says what does not fit."""
    state = unwrapped.state_dict
    own = model.state_dict()
    tied_pairs = declared_tied(model)
    tied = {k: tied_pairs[k] for k in own if k not in state and tied_pairs.get(k) in state}
    missing = [k for k in own if k not in state and k not in tied]
    unexpected = [k for k in state if k not in own]
    shapes = [k for k in own if k in state and state[k].shape != own[k].shape]
    if (missing or unexpected or shapes) and not allow_partial:
        raise LoadMismatch(_diff(what, missing, unexpected, shapes, state, own))
    loaded = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
    if not loaded:
        raise LoadMismatch(
            _diff(what, missing, unexpected, shapes, state, own).replace(what, f"{what}: not one tensor fits", 1)
        )
    model.load_state_dict(loaded, strict=not (missing or shapes or tied))
    tie: Any = getattr(model, "tie_weights", None)
    if tied and tie is not None:
        tie()
    return set(loaded), tied


def _diff(
    what: str,
    missing: list[str],
    unexpected: list[str],
    shapes: list[str],
    state: dict[str, torch.Tensor],
    own: dict[str, torch.Tensor],
) -> str:
    parts = [f"the weights do not fit {what}"]
    described = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}" for k in shapes]
    for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", described)):
        if items:
            parts.append(f"{title}: {_named(items)}")
    parts.append(
        "did you pass the right --arch, --model or --hf-config? (wrapper prefixes were already removed; "
        "--allow-partial exports a deliberate partial load, a re-initialised head, and records what was not loaded)"
    )
    return "; ".join(parts)


def check_finite(model: nn.Module, what: str) -> None:
    """LoadMismatch when a float parameter or buffer holds NaN or Inf: a diverged run, nothing to check."""
    bad = [k for k, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise LoadMismatch(
            f"{what}: {len(bad)} of its tensors hold NaN or Inf ({_named(bad)}): the training diverged, and an "
            "export of it could only be checked against the same NaNs; export an earlier checkpoint"
        )


def trace(
    model: nn.Module,
    unwrapped: Unwrapped,
    loaded: set[str],
    tied: dict[str, str],
    what: str,
    allow_partial: bool = False,
) -> Provenance:
    """Every parameter and buffer of `model` (as it will be exported) against the checkpoint tensor it came from;
    LoadMismatch when one differs. Run after every change made to the model (dtype, eval)."""
    check_finite(model, what)
    state = unwrapped.state_dict
    own = model.state_dict()
    digest = hashlib.sha256()
    for key in sorted(loaded):
        tensor = own[key]
        expected = state[key].to(tensor.dtype)
        if not torch.equal(tensor.cpu(), expected):
            raise LoadMismatch(f"{what}: {key} does not equal the checkpoint's tensor after loading; refused")
        digest.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for key, partner in tied.items():
        if not torch.equal(own[key].cpu(), state[partner].to(own[key].dtype)):
            raise LoadMismatch(f"{what}: {key} is declared tied to {partner} but does not equal it; refused")
    not_loaded = sorted(set(own) - loaded - set(tied))
    if not_loaded and not allow_partial:
        raise LoadMismatch(f"{what}: {len(not_loaded)} model tensors were not loaded ({_named(not_loaded)})")
    return Provenance(
        model_tensors=len(own),
        matched=len(loaded),
        tied=dict(sorted(tied.items())),
        checkpoint_tensors=len(state),
        sha256=digest.hexdigest(),
        not_loaded=not_loaded,
        unused=sorted(set(state) - loaded),
        outside_model=list(unwrapped.ignored),
        partial=allow_partial,
    )


def whole_module(model: nn.Module, what: str) -> Provenance:
    """A pickled module (--trust-pickle) is its own checkpoint: every tensor is the file's; checked finite."""
    state = model.state_dict()
    return trace(model, Unwrapped(dict(state)), set(state), {}, what)
