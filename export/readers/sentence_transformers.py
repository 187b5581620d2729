"""A sentence-transformers folder, read as `SentenceTransformer(folder)` reads it: every module from the path its
`modules.json` gives, every setting that changes a vector honoured or refused in one line.

Both layouts are read: 2.x-5.x (`sentence_transformers.models.Transformer`, `1_Pooling/config.json` with
`pooling_mode_*_tokens` flags, `max_seq_length` in `sentence_bert_config.json`) and 6.x
(`sentence_transformers.base.modules.transformer.Transformer`, `{"pooling_mode": "mean"}`, the length in the
tokenizer's `model_max_length`). What is honoured:
- the modules: a Transformer whose files are the folder's own, one Pooling (`mean` or `cls`), and a Normalize or none;
- `max_seq_length`: texts are cut to it, as `encode` cuts them;
- `config_sentence_transformers.json`'s `prompts` and `default_prompt_name`: the default prompt is put before every
  text as `encode(text)` puts it, and the service takes the others by name (contract/prompts.py).
A setting that would change a vector and is not one of these (`do_lower_case`, a pooling that leaves the prompt out,
processing options of the Transformer, another kind of model) is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.prompts import Prompts
from export.readers.hf_checkpoint import check_own_files

MODULES = "modules.json"  # the folder's modules, in order, each with the path of its own files
OWN_CONFIG = "config_sentence_transformers.json"  # prompts, the default prompt, the kind of model
TRANSFORMER_CONFIG = "sentence_bert_config.json"
# The class paths each release writes in modules.json for the three modules handoff reproduces
TRANSFORMER_TYPES = {
    "sentence_transformers.models.Transformer",
    "sentence_transformers.base.modules.transformer.Transformer",
    "sentence_transformers.base.modules.Transformer",
}
POOLING_TYPES = {
    "sentence_transformers.models.Pooling",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    "sentence_transformers.sentence_transformer.modules.Pooling",
}
NORMALIZE_TYPES = {
    "sentence_transformers.models.Normalize",
    "sentence_transformers.base.modules.normalize.Normalize",
    "sentence_transformers.base.modules.Normalize",
}
POOLINGS = ("mean", "cls")
LEGACY_POOLING_FLAGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
# Settings of each module's config that do not change a vector (names of tensors passed between modules, the
# release that wrote it), by module
WITHOUT_EFFECT = {
    "transformer": {"module_output_name", "modality_config", "transformer_task"},  # checked to be the defaults below
    "pooling": {"word_embedding_dimension", "embedding_dimension", "pooling_mode", "include_prompt"},
    "normalize": {"module_input_name", "module_output_name"},
    "own": {"__version__", "model_type", "prompts", "default_prompt_name", "similarity_fn_name"},
}
TEXT_FORWARD = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}


@dataclass(frozen=True)
class SentenceTransformersFolder:
    """What a sentence-transformers folder's modules do to a text's token vectors, and which files said so."""

    folder: Path
    pooling: str  # "mean" over the attention mask, or "cls": the first token's
    normalize: bool
    max_seq_length: int | None  # None: the tokenizer's own limit, as 6.x keeps it
    prompts: Prompts
    read: list[str] = field(default_factory=list)  # the files that said so, relative to the folder


def read_sentence_transformers(folder: Path, hidden_size: int) -> SentenceTransformersFolder | None:
    """The folder's modules and settings, or None for a folder without modules.json; ValueError in one line for a
    module or a setting this export does not reproduce."""
    if not (folder / MODULES).is_file():
        return None
    modules = _json(folder, MODULES, list)
    kinds = [_kind(folder, module) for module in modules]
    if kinds not in (["transformer", "pooling"], ["transformer", "pooling", "normalize"]):
        listed = ", ".join(str(m.get("type")) for m in modules if isinstance(m, dict))
        raise ValueError(
            f"{folder / MODULES}: {listed}: handoff reproduces a Transformer, a Pooling and an optional Normalize, "
            "in that order"
        )
    paths = [str(module.get("path", "")) for module in modules]
    if paths[0] != "":
        raise ValueError(
            f"{folder / MODULES}: the Transformer's files are in {paths[0]!r}; handoff reads them at the top"
        )
    read = [MODULES]
    transformer = _module_config(folder, "", TRANSFORMER_CONFIG, "transformer", read)
    pooling = _module_config(folder, paths[1], "config.json", "pooling", read)
    if len(kinds) == 3:
        _module_config(folder, paths[2], "config.json", "normalize", read)
    own = _json(folder, OWN_CONFIG, dict) if (folder / OWN_CONFIG).is_file() else {}
    if own:
        read.append(OWN_CONFIG)
    _check_settings(folder / OWN_CONFIG, own, "own")
    if own.get("model_type", "SentenceTransformer") != "SentenceTransformer":
        raise ValueError(
            f"{folder / OWN_CONFIG}: a {own['model_type']}; handoff exports a SentenceTransformer's vectors"
        )
    prompts = Prompts.read(own, str(folder / OWN_CONFIG))
    mode = _pooling_mode(folder / paths[1] / "config.json", pooling, hidden_size)
    if pooling.get("include_prompt", True) is False and any(prompts.named.values()):
        raise ValueError(
            f"{folder / paths[1] / 'config.json'}: include_prompt false (the prompt's tokens left out of the pooling) "
            "is not reproduced by handoff"
        )
    return SentenceTransformersFolder(
        folder, mode, len(kinds) == 3, _max_seq_length(folder, transformer), prompts, read
    )


def _kind(folder: Path, module: Any) -> str:
    kind = str(module.get("type", "")) if isinstance(module, dict) else ""
    for name, types in (("transformer", TRANSFORMER_TYPES), ("pooling", POOLING_TYPES), ("normalize", NORMALIZE_TYPES)):
        if kind in types:
            return name
    return kind or "(no type)"


def _module_config(folder: Path, path: str, name: str, kind: str, read: list[str]) -> dict[str, Any]:
    """A module's own config (`{} ` where it saved none), its settings checked, the file added to `read`."""
    relative = str(Path(path) / name) if path else name
    if Path(path).is_absolute() or ".." in Path(path).parts:
        raise ValueError(f"{folder / MODULES}: a module's path {path!r} is outside the folder")
    if not (folder / relative).is_file():
        return {}
    config = _json(folder, relative, dict)
    read.append(relative)
    if kind == "transformer":
        _check_transformer(folder / relative, config)
    else:
        _check_settings(folder / relative, config, kind)
    return config


def _check_transformer(path: Path, config: dict[str, Any]) -> None:
    """sentence_bert_config.json: the length is honoured; what else would change a vector is refused."""
    defaults = {"transformer_task": "feature-extraction", "module_output_name": "token_embeddings"}
    changed = [key for key, value in defaults.items() if config.get(key, value) != value]
    if config.get("modality_config", TEXT_FORWARD) != TEXT_FORWARD:
        changed.append("modality_config")
    if config.get("do_lower_case"):
        changed.append("do_lower_case")
    known = WITHOUT_EFFECT["transformer"] | {"max_seq_length", "do_lower_case"}
    changed += [key for key, value in config.items() if key not in known and value]
    if changed:
        raise ValueError(f"{path}: {', '.join(changed)}: not reproduced by handoff")


def _check_settings(path: Path, config: dict[str, Any], kind: str) -> None:
    legacy = (
        set(LEGACY_POOLING_FLAGS) | {k for k in config if k.startswith("pooling_mode_")} if kind == "pooling" else set()
    )
    unknown = [key for key, value in config.items() if key not in WITHOUT_EFFECT[kind] | legacy and value]
    if unknown:
        raise ValueError(f"{path}: {', '.join(unknown)}: settings handoff does not know, so does not reproduce")


def _pooling_mode(path: Path, config: dict[str, Any], hidden_size: int) -> str:
    """The one pooling `config` asks for, in either release's words."""
    if "pooling_mode" in config:
        modes = [config["pooling_mode"]] if isinstance(config["pooling_mode"], str) else config["pooling_mode"]
    else:
        modes = [
            key.removeprefix("pooling_mode_") for key, on in config.items() if key.startswith("pooling_mode_") and on
        ]
        modes = [LEGACY_POOLING_FLAGS.get(f"pooling_mode_{mode}", mode) for mode in modes]
    if not isinstance(modes, list) or len(modes) != 1 or modes[0] not in POOLINGS:
        raise ValueError(f"{path}: pooling {modes!r}; handoff reproduces one of {', '.join(POOLINGS)}")
    width = config.get("embedding_dimension", config.get("word_embedding_dimension", hidden_size))
    if width != hidden_size:
        raise ValueError(f"{path}: pooling {width} dimensions of a model whose hidden size is {hidden_size}")
    return str(modes[0])


def _max_seq_length(folder: Path, transformer: dict[str, Any]) -> int | None:
    length = transformer.get("max_seq_length")
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 1):
        raise ValueError(f"{folder / TRANSFORMER_CONFIG}: max_seq_length must be a positive number, not {length!r}")
    return length


def _json(folder: Path, relative: str, kind: type) -> Any:
    check_own_files(folder, (relative,))
    try:
        found = json.loads((folder / relative).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{folder / relative}: not readable JSON ({err})") from None
    if not isinstance(found, kind):
        raise ValueError(f"{folder / relative}: expected a JSON {'list' if kind is list else 'object'}")
    return found
