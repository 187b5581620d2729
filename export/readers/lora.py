"""A PEFT LoRA adapter merged into its base model's weights, as PEFT's `merge_and_unload` merges it, without PEFT.

An adapter checkpoint (Trainer's `checkpoint-N` of a PEFT model, or `save_pretrained`) holds `adapter_config.json`
and `adapter_model.safetensors`: for each adapted layer a low-rank pair (`lora_A.weight` and `lora_B.weight`; an
embedding's is `lora_embedding_A` and `lora_embedding_B`, with no suffix), DoRA's `lora_magnitude_vector` where
`use_dora`, and the modules trained whole (`modules_to_save`: a classifier's head). Merged, a layer's weight is

    W' = W + scale * (B @ A)                 scale = lora_alpha / r   (use_rslora: lora_alpha / sqrt(r))
    DoRA: W' = m / |W + scale * (B @ A)| * (W + scale * (B @ A))     (the norm of each output's row)

in the layer's (out, in) orientation. The layer's type decides a transpose, as PEFT decides it: GPT-2's `Conv1D`
stores (in, out) and an embedding (vocabulary, dim); `fan_in_fan_out` itself is ignored, since PEFT sets it from
the layer's type too. A module trained whole replaces the base's. Every adapter tensor must find its place in the
base, with the shapes the product needs, and every setting of adapter_config.json is one this module merges, one
that does not change the merged weights (`SETTINGS_WITHOUT_EFFECT`), or refused in one line: what PEFT will not
merge (an activated LoRA), handoff will not either. The merged state then loads into the model as any checkpoint
does, and provenance traces the exported model to it; the manifest's `provenance.adapter` records what was merged,
with the adapter file's sha256.
"""

from __future__ import annotations

import math
from collections.abc import Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from contract.manifest import sha256_file
from export.readers.hf_checkpoint import ADAPTER_WEIGHTS, read_adapter_config

PREFIX = "base_model.model."  # PEFT's wrapper around the base model, in every saved key
PAIRS = {"lora_A.weight": "lora_B.weight", "lora_embedding_A": "lora_embedding_B"}
MAGNITUDE = "lora_magnitude_vector"  # DoRA's per-output magnitude, saved beside the pair


@dataclass
class Adapter:
    """An adapter folder as read: its settings and tensors (PEFT's keys, `base_model.model.` removed)."""

    folder: Path
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    merged: list[str] = field(default_factory=list)  # base weights changed by a low-rank pair
    replaced: list[str] = field(default_factory=list)  # base tensors replaced by ones trained whole

    @property
    def scale(self) -> float:
        r, alpha = self.config["r"], self.config["lora_alpha"]
        return alpha / math.sqrt(r) if self.config.get("use_rslora") else alpha / r

    def to_manifest(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder.resolve()),
            "peft_type": "LORA",
            "dora": bool(self.config.get("use_dora")),
            "r": self.config["r"],
            "lora_alpha": self.config["lora_alpha"],
            "scale": self.scale,
            "tensors": len(self.tensors),
            "merged": len(self.merged),
            "replaced": self.replaced[:50],
            "sha256": sha256_file(self.folder / ADAPTER_WEIGHTS),  # the file's own: `sha256sum` checks it
        }


def read_adapter(folder: Path) -> Adapter:
    from safetensors.torch import load_file

    config = read_adapter_config(folder)
    weights = folder / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ValueError(f"{folder}: no {ADAPTER_WEIGHTS} (an adapter saved as .bin: save it with safetensors)")
    tensors = {}
    for name, tensor in load_file(str(weights)).items():
        if not name.startswith(PREFIX):
            raise ValueError(f"{weights}: {name} is not a PEFT model's key ({PREFIX}...)")
        tensors[name.removeprefix(PREFIX)] = tensor
    return Adapter(folder, config, tensors)


def stored_transposed(model: nn.Module) -> set[str]:
    """The layers of `model` whose weight is stored (in, out), as PEFT finds them: GPT-2's `Conv1D` and embeddings
    (vocabulary, dim). A LoRA pair's product is transposed for them, and only for them, whatever fan_in_fan_out says."""
    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Embedding) or type(module).__name__ == "Conv1D"
    }


def merge(adapter: Adapter, base: dict[str, torch.Tensor], transposed: Set[str]) -> dict[str, torch.Tensor]:
    """The base's tensors with the adapter merged in (a new dict; the base's tensors are not changed); `transposed`
    names the layers stored (in, out) (`stored_transposed`). ValueError for an adapter tensor with no place in the
    base, or a pair whose shapes do not make the base weight's."""
    merged = dict(base)
    used: set[str] = set()
    for name, first in adapter.tensors.items():
        kind = next((k for k in PAIRS if name.endswith(f".{k}")), None)
        if kind is None:
            continue
        layer = name.removesuffix(f".{kind}")
        second_name, target = f"{layer}.{PAIRS[kind]}", f"{layer}.weight"
        if second_name not in adapter.tensors or target not in base:
            raise ValueError(f"{adapter.folder}: {name} has no {PAIRS[kind]} beside it or no {target} in the base")
        flip = layer in transposed
        weight = base[target].float().T if flip else base[target].float()  # (out, in)
        delta = adapter.tensors[second_name].float() @ first.float()
        if delta.shape != weight.shape:
            raise ValueError(
                f"{adapter.folder}: {layer}'s pair makes {list(delta.shape)}, the base's weight is "
                f"{list(weight.shape)} as (out, in): not this base model's adapter"
            )
        new = weight + adapter.scale * delta
        used |= {name, second_name}
        if adapter.config.get("use_dora"):
            new = _dora(adapter, layer, new)
            used.add(f"{layer}.{MAGNITUDE}")
        merged[target] = (new.T if flip else new).to(base[target].dtype)
        adapter.merged.append(target)
    for name, tensor in adapter.tensors.items():
        if name in used:
            continue
        if name not in base or base[name].shape != tensor.shape:
            raise ValueError(f"{adapter.folder}: {name} has no place of its shape in the base model")
        merged[name] = tensor.to(base[name].dtype)
        adapter.replaced.append(name)
    return merged


def _dora(adapter: Adapter, layer: str, combined: torch.Tensor) -> torch.Tensor:
    """DoRA's merge of a layer whose weight plus its pair's product is `combined` (out, in): each output's row
    scaled to the trained magnitude (an embedding's rows are its dimensions, as PEFT norms them)."""
    magnitude = adapter.tensors.get(f"{layer}.{MAGNITUDE}")
    if magnitude is None or magnitude.shape != combined.shape[:1]:
        raise ValueError(f"{adapter.folder}: {layer}: DoRA without a {MAGNITUDE} of {combined.shape[0]} values")
    return magnitude.float().view(-1, 1) / torch.linalg.norm(combined, dim=1, keepdim=True) * combined
