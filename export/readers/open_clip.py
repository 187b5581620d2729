"""An open_clip checkpoint, found by the files open_clip writes beside its weights, and the model it describes.

Two layouts name an open_clip model:
- a model folder (what `open_clip.push_to_hf_hub` writes, and `create_model("local-dir:FOLDER")` reads):
  `open_clip_config.json` (`model_cfg`, `preprocess_cfg`) beside its weights (`WEIGHT_FILES`); given the folder or
  its weights file;
- open_clip_train's run: `logs/NAME/checkpoints/epoch_N.pt` (`state_dict` under DDP's `module.`, beside the
  optimizer) and `logs/NAME/params.txt`, which names the model (`model: ViT-B-32`, or `local-dir:FOLDER`) and the
  settings that changed it (`TRAINING_SETTINGS`), each honoured as training's `create_model_and_transforms` took
  it; a setting that changes the model and is not read here is refused by name.

The model is built by open_clip itself (`create_model_and_transforms(name, load_weights=False)`: nothing is
downloaded) and the checkpoint's tensors loaded into it with their provenance (export/provenance.py).
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPEN_CLIP_CONFIG = "open_clip_config.json"
# open_clip's own order of preference among a model folder's weights
WEIGHT_FILES = (
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.safetensors",
    "open_clip_pytorch_model.bin",
    "open_clip_pytorch_model.pth",
)
PARAMS = "params.txt"  # open_clip_train's record of its arguments, in the run's folder
LOCAL_DIR = "local-dir:"

# open_clip_train's arguments that change the model or its evaluation transform, as create_model_and_transforms
# takes them; `siglip` adds the logit bias its loss trains.
TRAINING_SETTINGS = (
    "force_quick_gelu",
    "force_custom_text",
    "force_image_size",
    "force_context_length",
    "image_mean",
    "image_std",
    "image_interpolation",
    "image_resize_mode",
    "siglip",
)
# Arguments that change the model's layers in ways not read here: refused when set.
REFUSED_SETTINGS = ("distill", "lock_image", "lock_text", "use_bnb_linear", "torchscript", "model_kwargs")


@dataclass(frozen=True)
class OpenClipCheckpoint:
    """Where the weights are, the model name open_clip builds from, and training's settings."""

    weights: Path
    model: str  # a built-in name, or local-dir:FOLDER
    named_by: Path  # the file that names the model (open_clip_config.json or params.txt)
    settings: dict[str, Any] = field(default_factory=dict)  # TRAINING_SETTINGS that were set

    @property
    def architecture(self) -> str:
        return f"open_clip {self.model.removeprefix(LOCAL_DIR)}"


def find_open_clip(path: Path) -> OpenClipCheckpoint | None:
    """The open_clip checkpoint at `path` (module docstring), or None when no open_clip file names a model."""
    folder = path if path.is_dir() else path.parent
    if (folder / OPEN_CLIP_CONFIG).is_file():
        weights = path if path.is_file() else next((folder / n for n in WEIGHT_FILES if (folder / n).is_file()), None)
        if weights is None:
            raise ValueError(f"{folder / OPEN_CLIP_CONFIG}: an open_clip model folder with no weights ({WEIGHT_FILES})")
        return OpenClipCheckpoint(weights, f"{LOCAL_DIR}{folder.resolve()}", folder / OPEN_CLIP_CONFIG)
    params = folder.parent / PARAMS
    if path.is_file() and folder.name == "checkpoints" and params.is_file():
        return _trained(path, params)
    return None


def _trained(weights: Path, params: Path) -> OpenClipCheckpoint:
    """open_clip_train's checkpoint, its model and settings read from the run's params.txt."""
    recorded = read_params(params)
    model = str(recorded.get("model") or "")
    if not model:
        raise ValueError(f"{params}: open_clip_train's record names no model (a `model:` line)")
    if model.startswith("hf-hub:"):
        raise ValueError(
            f"{params}: model {model} is read from the Hugging Face Hub, and nothing is downloaded here; "
            f"save it with open_clip's push_to_hf_hub layout and export that folder, or its {OPEN_CLIP_CONFIG}'s "
            "folder as local-dir:"
        )
    if model.startswith(LOCAL_DIR) and not (Path(model.removeprefix(LOCAL_DIR)) / OPEN_CLIP_CONFIG).is_file():
        raise ValueError(f"{params}: model {model}, but there is no {OPEN_CLIP_CONFIG} there")
    refused = [name for name in REFUSED_SETTINGS if recorded.get(name) not in (None, False, "", {}, [])]
    if refused:
        raise ValueError(f"{params}: trained with {', '.join(refused)}, which handoff does not read yet")
    settings = {name: recorded[name] for name in TRAINING_SETTINGS if recorded.get(name) not in (None, False)}
    return OpenClipCheckpoint(weights, model, params, settings)


def read_params(params: Path) -> dict[str, Any]:
    """open_clip_train's params.txt (`name: value`, Python's repr of each value) as a dict of values."""
    values: dict[str, Any] = {}
    for line in params.read_text(encoding="utf-8").splitlines():
        name, colon, text = line.partition(": ")
        if not colon:
            continue
        try:
            values[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            values[name] = text  # a bare string (a model name, a path)
    return values


def build_open_clip(checkpoint: OpenClipCheckpoint, load: bool = False) -> tuple[Any, Any, Any]:
    """(model, evaluation transform, tokenizer) as open_clip builds them for this checkpoint: with no weights (handoff
    loads them, with their provenance), or, with `load`, the weights loaded by open_clip itself (the reference).
    A model folder is read from a scratch folder holding its config (and, with `load`, a link to the weights), so
    that open_clip reads exactly the checkpoint's weights file; nothing is downloaded."""
    import open_clip

    kwargs = _create_arguments(checkpoint.settings)
    with tempfile.TemporaryDirectory() as scratch, _quiet_open_clip():
        name, pretrained = checkpoint.model, str(checkpoint.weights) if load else None
        if name.startswith(LOCAL_DIR):
            config = json.loads((Path(name.removeprefix(LOCAL_DIR)) / OPEN_CLIP_CONFIG).read_text(encoding="utf-8"))
            (Path(scratch) / OPEN_CLIP_CONFIG).write_text(json.dumps(config))
            if load:
                suffix = ".safetensors" if checkpoint.weights.suffix == ".safetensors" else ".pth"
                (Path(scratch) / f"open_clip_pytorch_model{suffix}").symlink_to(checkpoint.weights.resolve())
            name, pretrained = f"{LOCAL_DIR}{scratch}", None
        model, _, transform = open_clip.create_model_and_transforms(
            name, pretrained, load_weights=load, weights_only=True, **kwargs
        )
        length = kwargs.get("force_context_length")
        tokenizer = open_clip.get_tokenizer(name, **({"context_length": length} if length else {}))
    return model.float().eval(), transform, tokenizer


def _create_arguments(settings: dict[str, Any]) -> dict[str, Any]:
    """open_clip_train's recorded settings as create_model_and_transforms' arguments, as training passed them."""
    kwargs = {name: value for name, value in settings.items() if name != "siglip"}
    if settings.get("siglip"):  # the logit scale and bias open_clip_train creates for its SigLIP loss
        kwargs |= {"init_logit_scale": math.log(10), "init_logit_bias": -10}
    return kwargs


@contextlib.contextmanager
def _quiet_open_clip() -> Iterator[None]:
    """open_clip's warnings that a model has no weights yet (handoff loads them next) are not the user's news."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
