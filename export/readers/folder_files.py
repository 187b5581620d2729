"""Every file of a checkpoint folder accounted for: what the export read and what it set aside, and why, for the
manifest's `source.files` (docs/export.md, "What the export reads from each kind of folder").

A file is named by what it is to the libraries that write such folders (transformers' Trainer and `save_pretrained`,
sentence-transformers, PEFT, Accelerate): the model's config and weights, its tokenizer, its generation or image
processing settings, a sentence-transformers module's config, an adapter; training state that changes no answer
(the optimizer, the scheduler, the random states, Trainer's state and arguments); a model card. What the export read
of them, each task's reader decides and checks (a setting it cannot honour is refused there, in one line); a file
none of them names is set aside and listed as such, since no library that loads the folder reads it either.
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

# name patterns, first match wins: what the file is, and whether the export reads it
ROLES: tuple[tuple[str, str], ...] = (
    ("config.json", "read: the model's architecture and settings"),
    ("generation_config.json", "read: generation settings (a language model's; generation_config in the manifest)"),
    ("model.safetensors", "read: the weights"),
    ("model-*-of-*.safetensors", "read: the weights (a shard)"),
    ("model.safetensors.index.json", "read: the weights' index"),
    ("pytorch_model.bin", "read: the weights (weights_only)"),
    ("pytorch_model-*-of-*.bin", "read: the weights (a shard, weights_only)"),
    ("pytorch_model.bin.index.json", "read: the weights' index"),
    ("tokenizer.json", "read: the tokenizer (served)"),
    ("tokenizer_config.json", "read: the tokenizer's settings"),
    ("special_tokens_map.json", "read: the tokenizer's special tokens"),
    ("added_tokens.json", "read: the tokenizer's added tokens"),
    ("vocab.txt", "read: the tokenizer's vocabulary"),
    ("vocab.json", "read: the tokenizer's vocabulary"),
    ("merges.txt", "read: the tokenizer's merges"),
    ("*.model", "read: the tokenizer's SentencePiece model"),
    ("chat_template.jinja", "read: the chat template"),
    ("chat_template.json", "read: the chat template"),
    ("preprocessor_config.json", "read: the image processor (an image model's; checked against transformers')"),
    ("modules.json", "read: sentence-transformers' modules"),
    ("sentence_bert_config.json", "read: sentence-transformers' Transformer module"),
    ("config_sentence_transformers.json", "read: sentence-transformers' prompts and model type"),
    (
        "*/config.json",
        "a sentence-transformers module's: read where modules.json names its folder (the manifest's read)",
    ),
    ("*.distcp", "read: the weights (a torch.distributed.checkpoint shard; the model's keys only)"),
    ("*.metadata", "read: torch.distributed.checkpoint's index (its own classes only)"),
    ("adapter_config.json", "read: the LoRA adapter's settings"),
    ("adapter_model.safetensors", "read: the LoRA adapter"),
    ("optimizer.pt", "set aside: Trainer's optimizer state, which changes no answer"),
    ("scheduler.pt", "set aside: Trainer's scheduler state, which changes no answer"),
    ("scaler.pt", "set aside: Trainer's gradient scaler, which changes no answer"),
    ("optimizer*.bin", "set aside: Accelerate's optimizer state, which changes no answer"),
    ("scheduler*.bin", "set aside: Accelerate's scheduler state, which changes no answer"),
    ("random_states_*.pkl", "set aside: Accelerate's random states (pickles, never loaded)"),
    ("rng_state*.pth", "set aside: Trainer's random states, which change no answer"),
    ("trainer_state.json", "set aside: Trainer's progress and logs"),
    ("training_args.bin", "set aside: Trainer's arguments (a pickle, never loaded)"),
    ("*_results.json", "set aside: Trainer's metrics"),
    ("*.md", "set aside: documentation (a model card)"),
    (".gitattributes", "set aside: git's settings"),
)
MAX_LISTED = 200  # a folder of many files (shards, logs) is listed up to here, then counted


def account_for(folder: Path, set_aside: list[str]) -> dict[str, str]:
    """Each file of `folder` and of its subfolders one level down (sentence-transformers' modules), by relative name,
    with what the export did with it; `set_aside`: the weight readers' own ("name: why") come first."""
    own = {line.split(": ", 1)[0]: f"set aside: {line.split(': ', 1)[1]}" for line in set_aside}
    files = sorted(
        p.relative_to(folder).as_posix()
        for p in [*folder.iterdir(), *(q for d in folder.iterdir() if d.is_dir() for q in d.iterdir())]
        if p.is_file() and not p.is_symlink()
    )
    found = {name: own.get(name) or _role(name) for name in files[:MAX_LISTED]}
    if len(files) > MAX_LISTED:
        found["..."] = f"{len(files) - MAX_LISTED} more files, not listed"
    return found


def _role(name: str) -> str:
    for pattern, role in ROLES:
        if fnmatch(name, pattern):
            return role
    return "set aside: no library that loads such a folder reads it, and neither does the export"
