"""Hugging Face checkpoints: a folder whose `config.json` names the model, and the weights beside it or elsewhere.

    python -m export out/checkpoint-30                      # Trainer's checkpoint-N, or a save_pretrained folder
    python -m export out/                                   # the newest checkpoint-N in Trainer's output folder
    python -m export state.pt --hf-config base-model/       # a plain DDP state_dict (`module.` keys) and its config
    python -m export accel_state/ --hf-config base-model/   # an Accelerate save_state folder and its config
    python -m export out/checkpoint-30                      # a PEFT LoRA adapter: merged into the base its
                                                            # adapter_config.json names (or --hf-config names)

The weights are read as every other checkpoint is (export/readers/folders.py: `model.safetensors`, sharded safetensors
with their index, `pytorch_model.bin` with weights_only=True). The model is built from the config with
transformers' Auto classes; a config that needs the model's own code (`auto_map`) is refused unless
--trust-remote-code, since that runs code from the folder. transformers is imported only on this path.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG = "config.json"
ADAPTER_CONFIG = "adapter_config.json"  # PEFT's: an adapter's folder, holding no config.json of its own
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# A LoRA adapter's settings, each merged by export/readers/lora.py, shown to change nothing merged, or refused
MERGED_SETTINGS = {"peft_type", "r", "lora_alpha", "use_rslora", "use_dora", "bias", "lora_bias", "fan_in_fan_out"}
SETTINGS_WITHOUT_EFFECT = {  # what says where the adapter came from or how it trained, not what it merges to
    "base_model_name_or_path", "revision", "peft_version", "task_type", "inference_mode", "auto_mapping",
    "target_modules", "exclude_modules", "layers_to_transform", "layers_pattern",  # the saved tensors say which
    "modules_to_save",  # replaced as saved
    "lora_dropout", "megatron_core",  # training only; the module path Megatron would use
    "qalora_group_size",  # read only with use_qalora, refused below
    "eva_config", "lora_ga_config",  # initialisations of A and B alone: the saved pair is what trained
}  # fmt: skip
# init_lora_weights values that start A and B alone; others (PiSSA, OLoRA, CorDA, LoftQ) rewrite the base's weights
PLAIN_INITIALISATIONS = (True, False, "gaussian", "eva", "lora_ga", "orthogonal")
REFUSED = {  # settings PEFT merges differently, or not at all: refused, never merged wrongly
    "alora_invocation_tokens": "an activated LoRA (alora_invocation_tokens), which PEFT does not merge either",
    "rank_pattern": "per-layer ranks (rank_pattern)",
    "alpha_pattern": "per-layer alphas (alpha_pattern)",
    "layer_replication": "layer replication",
    "lora_bias": "a trained LoRA bias",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    "target_parameters": "LoRA on parameters (target_parameters)",
    "ensure_weight_tying": "adapters tied across tied weights (ensure_weight_tying)",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
# Every file a tokenizer may be read from, checked to be the folder's own (check_own_files)
TOKENIZER_READS = (
    *TOKENIZER_FILES,
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
TRAINER_CHECKPOINT = re.compile(r"checkpoint-([0-9]+)")  # ASCII digits: `checkpoint-٩٩` is no step


@dataclass(frozen=True)
class HfCheckpoint:
    """Where the config (and, found beside it, the tokenizer) is, and where the weights are."""

    config_dir: Path
    weights: Path
    config: dict[str, Any]
    adapter: Path | None = None  # a LoRA adapter's folder, merged into the weights (export/readers/lora.py)

    @property
    def architecture(self) -> str:
        return (self.config.get("architectures") or [""])[0]


def _newest_trainer_checkpoint(folder: Path) -> Path | None:
    steps = [(int(m.group(1)), p) for p in folder.iterdir() if (m := TRAINER_CHECKPOINT.fullmatch(p.name))]
    steps = [(n, p) for n, p in steps if (p / CONFIG).is_file() or (p / ADAPTER_CONFIG).is_file()]
    return max(steps)[1] if steps else None


def check_own_files(folder: Path, names: tuple[str, ...]) -> None:
    """ValueError when one of `names` in `folder` is a link or not a regular file: a link planted among a
    checkpoint's files (`vocab.txt` -> a file elsewhere) would ship that file's lines as tokens (security round 4)."""
    for name in names:
        path = folder / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise ValueError(
                f"{path}: a link or not a regular file; a checkpoint's config and tokenizer files are its own, refused"
            )


def _read_config(folder: Path) -> dict[str, Any]:
    check_own_files(folder, (CONFIG,))
    path = folder / CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable Hugging Face config ({err})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"{path}: not a Hugging Face model config (no model_type)")
    return config


def find_hf_checkpoint(checkpoint: Path, hf_config: Path | None) -> HfCheckpoint | None:
    """The Hugging Face checkpoint at `checkpoint` (with `hf_config`, its config folder), or None when it is not
    one (no config.json beside the weights, and no --hf-config)."""
    if checkpoint.is_dir() and not (checkpoint / CONFIG).is_file() and not (checkpoint / ADAPTER_CONFIG).is_file():
        checkpoint = _newest_trainer_checkpoint(checkpoint) or checkpoint
    if (checkpoint / ADAPTER_CONFIG).is_file() and not (checkpoint / CONFIG).is_file():
        return _adapter_checkpoint(checkpoint, hf_config)
    if hf_config is not None:
        if not (hf_config / CONFIG).is_file():
            raise ValueError(f"--hf-config={hf_config}: no {CONFIG} there (a save_pretrained or checkpoint folder)")
        return HfCheckpoint(hf_config, checkpoint, _read_config(hf_config))
    if not (checkpoint / CONFIG).is_file():
        return None
    config = _read_config(checkpoint)
    return HfCheckpoint(checkpoint, checkpoint, config) if "architectures" in config else None


def _adapter_checkpoint(folder: Path, hf_config: Path | None) -> HfCheckpoint:
    """A LoRA adapter's folder: its base model (--hf-config, else the folder its config names), the adapter beside."""
    named = read_adapter_config(folder).get("base_model_name_or_path")
    base = hf_config if hf_config is not None else Path(str(named)) if named else None
    if base is None or not (base / CONFIG).is_file():
        given = f"--hf-config={hf_config}" if hf_config is not None else f"its base_model_name_or_path {named!r}"
        raise ValueError(
            f"{folder / ADAPTER_CONFIG}: a LoRA adapter, merged into its base model at export; {given} is not a "
            "model folder here (nothing is downloaded): --hf-config BASE_DIR names the base's save_pretrained folder"
        )
    return HfCheckpoint(base, base, _read_config(base), adapter=folder)


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
    refused = [what for key, what in REFUSED.items() if config.get(key)]
    if config.get("bias", "none") != "none":
        refused.append(f"bias={config['bias']!r}")
    if config.get("init_lora_weights", True) not in PLAIN_INITIALISATIONS:
        refused.append(f"init_lora_weights={config['init_lora_weights']!r}, which rewrites the base's weights")
    known = MERGED_SETTINGS | SETTINGS_WITHOUT_EFFECT | set(REFUSED) | {"init_lora_weights"}
    refused += [f"{key}={value!r}" for key, value in config.items() if key not in known and value]
    if refused:
        raise ValueError(f"{path}: {', '.join(refused)}: not merged by handoff; merge_and_unload() it with PEFT")
    if not isinstance(config.get("r"), int) or config["r"] < 1 or not isinstance(config.get("lora_alpha"), int | float):
        raise ValueError(f"{path}: r and lora_alpha must be numbers (r >= 1)")
    return config


PROCESSOR_CONFIGS = ("preprocessor_config.json", "processor_config.json")  # transformers 5 may write the second alone


def processor_folder(hf: HfCheckpoint, what: str) -> Path:
    """The folder of the checkpoint's processor (an image processor, a feature extractor): the config's, else the
    weights' (`what` it is, in words, for the error); ValueError naming where it looked."""
    weights_folder = hf.weights if hf.weights.is_dir() else hf.weights.parent
    candidates = dict.fromkeys((hf.config_dir, weights_folder))
    for folder in candidates:
        if any((folder / name).is_file() for name in PROCESSOR_CONFIGS):
            return folder
    where = " or ".join(str(folder) for folder in candidates)
    raise ValueError(
        f"no {' or '.join(PROCESSOR_CONFIGS)} in {where}: the {what}; save it with the model "
        "(Trainer(processing_class=processor) or processor.save_pretrained)"
    )


def tokenizer_folder(hf: HfCheckpoint, tokenizer: Path | None) -> Path | None:
    """Where the tokenizer is: --tokenizer, else beside the config (Trainer saves it there), else beside the weights."""
    if tokenizer is not None:
        if not any((tokenizer / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(f"--tokenizer={tokenizer}: no tokenizer files there ({', '.join(TOKENIZER_FILES[:2])})")
        return tokenizer
    beside = [hf.adapter] if hf.adapter is not None else []  # Trainer saves it with the adapter, trained or not
    for folder in (*beside, hf.config_dir, hf.weights if hf.weights.is_dir() else hf.weights.parent):
        if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
            return folder
    return None
