"""A PEFT LoRA adapter merged into its base model's weights, as PEFT's `merge_and_unload` merges it, without PEFT.

An adapter checkpoint (Trainer's `checkpoint-N` of a PEFT model, or `save_pretrained`) holds `adapter_config.json`
and `adapter_model.safetensors`: for each adapted layer a low-rank pair (`lora_A`, `lora_B`), and the modules
trained whole (`modules_to_save`: a classifier's head). Merged, a layer's weight is

    W + scale * (B @ A)          scale = lora_alpha / r   (use_rslora: lora_alpha / sqrt(r))

(transposed for `fan_in_fan_out` layers, GPT-2's Conv1D; an embedding's pair is `lora_embedding_A`/`_B`), and a
module trained whole replaces the base's. Every adapter tensor must find its place in the base, with the shapes
the product needs; anything else (DoRA, per-layer ranks, a bias the adapter trained) is refused in one line until
tried. The merged state then loads into the model as any checkpoint does, and provenance traces the exported model
to it; the manifest's `provenance.adapter` records what was merged, with the adapter file's sha256.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from contract.manifest import sha256_file
from export.readers.hf_checkpoint import ADAPTER_CONFIG, check_own_files

ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."  # PEFT's wrapper around the base model, in every saved key
PAIRS = {"lora_A": "lora_B", "lora_embedding_A": "lora_embedding_B"}
UNTRIED = {  # adapter settings whose merge this module does not do yet: refused, never merged wrongly
    "use_dora": "DoRA",
    "rank_pattern": "per-layer ranks (rank_pattern)",
    "alpha_pattern": "per-layer alphas (alpha_pattern)",
    "layer_replication": "layer replication",
    "lora_bias": "a trained LoRA bias",
}


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
            "r": self.config["r"],
            "lora_alpha": self.config["lora_alpha"],
            "scale": self.scale,
            "tensors": len(self.tensors),
            "merged": len(self.merged),
            "replaced": self.replaced[:50],
            "sha256": sha256_file(self.folder / ADAPTER_WEIGHTS),  # the file's own: `sha256sum` checks it
        }


def read_adapter_config(folder: Path) -> dict[str, Any]:
    """adapter_config.json, checked to be a LoRA adapter this module merges (ValueError in one line otherwise)."""
    check_own_files(folder, (ADAPTER_CONFIG, ADAPTER_WEIGHTS))
    path = folder / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable adapter config ({err})") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else None
        raise ValueError(f"{path}: a {kind} adapter; handoff merges LoRA adapters (merge it with PEFT first)")
    untried = [what for key, what in UNTRIED.items() if config.get(key)]
    if config.get("bias", "none") != "none":
        untried.append(f"bias={config['bias']!r}")
    if untried:
        raise ValueError(f"{path}: {', '.join(untried)}: not merged by handoff yet; merge_and_unload() it with PEFT")
    if not isinstance(config.get("r"), int) or config["r"] < 1 or not isinstance(config.get("lora_alpha"), int | float):
        raise ValueError(f"{path}: r and lora_alpha must be numbers (r >= 1)")
    return config


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


def merge(adapter: Adapter, base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base's tensors with the adapter merged in (a new dict; the base's tensors are not changed). ValueError
    for an adapter tensor with no place in the base, or a pair whose shapes do not make the base weight's."""
    merged = dict(base)
    used: set[str] = set()
    for name, first in adapter.tensors.items():
        module, _, rest = name.rpartition(".")  # "...q_lin.lora_A", "weight"
        layer, _, kind = module.rpartition(".")
        if kind not in PAIRS:
            continue
        second_name = f"{layer}.{PAIRS[kind]}.{rest}"
        target = f"{layer}.weight"
        if second_name not in adapter.tensors or target not in base:
            raise ValueError(f"{adapter.folder}: {name} has no {PAIRS[kind]} beside it or no {target} in the base")
        second = adapter.tensors[second_name].float()
        delta = second @ first.float()
        if kind == "lora_embedding_A" or adapter.config.get("fan_in_fan_out"):  # (vocabulary, dim); Conv1D's (in, out)
            delta = delta.T
        if delta.shape != base[target].shape:
            raise ValueError(
                f"{adapter.folder}: {layer}'s pair makes {list(delta.shape)}, the base's weight is "
                f"{list(base[target].shape)}: not this base model's adapter"
            )
        merged[target] = (base[target].float() + adapter.scale * delta).to(base[target].dtype)
        adapter.merged.append(target)
        used |= {name, second_name}
    for name, tensor in adapter.tensors.items():
        if name in used:
            continue
        if name not in base or base[name].shape != tensor.shape:
            raise ValueError(f"{adapter.folder}: {name} has no place of its shape in the base model")
        merged[name] = tensor.to(base[name].dtype)
        adapter.replaced.append(name)
    return merged
