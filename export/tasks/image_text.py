"""A Hugging Face image-text model (CLIP, SigLIP: the architecture transformers' zero-shot image classification
pipeline loads for the config's model type), fine-tuned contrastively with Trainer or a plain DDP loop, exported as
its two towers with its processor: images in, `image_embeds` out (`get_image_features`); texts in, `text_embeds` out
(`get_text_features`); and zero-shot classification from the two (contract/image_text.py).

The export folder holds each tower as an export of its own, written and proved as any model is (image/: the
processor's preprocessing as the manifest's `preprocess`, checked against transformers' processor; text/: the
tokenizer, its ids and padding checked as every text model's), and an outer manifest that hashes both manifests,
records the model's `logit_scale` and `logit_bias`, and the library's checks: each tower's embeddings against the
library's own `get_image_features` / `get_text_features` on the processor's inputs, and the zero-shot scores against
`pipeline("zero-shot-image-classification")` on the folder, its hypothesis template included.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from contract.manifest import Manifest
from contract.signature import TASK_IMAGE_TEXT
from contract.tokenizer_spec import TOKENIZER_JSON
from export.hf_text import hf_manifest, load_hf_text, tokenized_job, training_tokenizer
from export.image_processor import check_processor, hf_preprocessing, report
from export.inputs import REAL_IMAGES, real_images
from export.job import Job, log_loading
from export.open_clip import open_clip_towers
from export.pipeline import (
    Check,
    ExportRequest,
    ExportTask,
    tolerance_of,
)
from export.readers.hf_checkpoint import CONFIG, PROCESSOR_CONFIGS, HfCheckpoint, processor_folder
from export.reference import image_text_reference
from export.steps import timed
from export.towers import ImageTextTowers, image_tower, towers_manifest, write_towers, zero_shot_settings

PROCESSOR = "processor (its image processor and tokenizer), which says how images and texts become the model's input"


def is_image_text(hf: HfCheckpoint) -> bool:
    """Whether transformers' zero-shot image classification pipeline loads this architecture for the config's model
    type (CLIPModel, SiglipModel, ...: a bare `*Model`, as an encoder's name is)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES

    return (
        MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES.get(str(hf.config.get("model_type"))) == hf.architecture
    )


def pooled(features: Any) -> torch.Tensor:
    """A `get_*_features` answer: the projected embeddings (transformers 5 returns them as the pooler output)."""
    return features if isinstance(features, torch.Tensor) else features.pooler_output


class ImageFeatures(nn.Module):
    """The image tower: normalised pixels in, the projected image embeddings out."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"image_embeds": pooled(self.model.get_image_features(pixel_values=pixel_values))}


class TextFeatures(nn.Module):
    """The text tower: token inputs by name in, the projected text embeddings out."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"text_embeds": pooled(self.model.get_text_features(**inputs))}


class ImageEmbeds(nn.Module):
    """The image tower giving a tensor, as the processor check calls a model."""

    def __init__(self, tower: ImageFeatures) -> None:
        super().__init__()
        self.tower = tower

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.tower(pixel_values)["image_embeds"]


def image_text_job(request: ExportRequest) -> Job:
    """The export of an image-text model: its towers as its source makes them (an open_clip checkpoint, else a
    Hugging Face folder), bound by one outer manifest."""
    towers = open_clip_towers(request, request.open_clip) if request.open_clip is not None else _hf_towers(request)
    return _towers_job(request, towers)


def _towers_job(request: ExportRequest, parts: ImageTextTowers) -> Job:
    """The outer manifest of `parts`' towers, their settings and the library's checks; the served tokenizer beside
    it, as a text model's, with the source's own files."""
    towers = {"image": parts.image, "text": parts.text}
    manifest = towers_manifest(request, parts.origin, parts.architecture, towers, TASK_IMAGE_TEXT)
    manifest |= {"preprocess": parts.preprocess, "tokenizer": parts.text.manifest["tokenizer"]}
    manifest["image_text"] = parts.settings.to_manifest()
    width = int(parts.image.manifest["signature"]["outputs"][0]["shape"][-1])
    manifest["embedding"] = {"pooling": "the model's projection", "normalized": False, "dimensions": width}
    manifest["reference"] = parts.reference.to_manifest()
    manifest |= parts.fields  # type: ignore[typeddict-item]  # a source's own section: `hf` or `open_clip`

    def files(out: Path) -> list[str]:
        own = parts.files(out)
        shutil.copyfile(out / "text" / TOKENIZER_JSON, out / TOKENIZER_JSON)
        return [*own, TOKENIZER_JSON]

    assert parts.reference.checks is not None
    checks = parts.reference.checks

    def write(out: Path) -> int:
        return write_towers(out, manifest, towers, "image_text", lambda out: checks(parts.photos, out), files)

    image_shape = "x".join(map(str, parts.image.manifest["signature"]["inputs"][0]["shape"][1:]))
    described = (
        f"{parts.architecture} (image tower {image_shape}, text tower of "
        f"{parts.text.manifest['tokenizer']['max_length']} tokens; zero-shot by {parts.settings.scores})"
    )
    return Job(manifest, write, described)


def _hf_towers(request: ExportRequest) -> ImageTextTowers:
    """A Hugging Face image-text model's towers: the image tower checked against its processor, the text tower as
    every text model's, the library's reference on the folder."""
    options, hf = request.options, request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    folder = processor_folder(hf, PROCESSOR)
    preprocess = hf_preprocessing(folder, options.read.trust_remote_code)[1].to_manifest()
    loaded = load_hf_text(request, hf, "AutoModel")
    tokenizer = training_tokenizer(request, hf, loaded, "image-text model")
    settings = zero_shot_settings(loaded.model, sigmoid="siglip" in str(loaded.model.config.model_type))
    text = tokenized_job(
        request, hf, loaded, tokenizer, TextFeatures(loaded.model), {}, "the text tower", reference=None
    )
    photos, _ = real_images(None, options.parity.samples, REAL_IMAGES)
    tower = ImageFeatures(loaded.model).eval()

    def manifest_of(signature: Any, dynamic: dict[str, tuple[int, ...]]) -> Manifest:
        log_loading(loaded.src, loaded.unwrapped)
        return hf_manifest(hf, signature, dynamic, loaded.src, loaded.unwrapped, loaded.provenance, request.timings)

    def processor_check(manifest: Manifest) -> Check:
        with timed(manifest["timings"], "preprocess_check"):
            check = check_processor(folder, ImageEmbeds(tower), preprocess, photos, options.read.trust_remote_code)
        manifest["preprocess_check"] = report(check)
        return ("image processor", None if check.passed else check.line())

    def processor_files(out: Path) -> list[str]:
        copied = [name for name in PROCESSOR_CONFIGS if (folder / name).is_file()]
        for name in copied:
            shutil.copyfile(folder / name, out / name)
        return copied

    return ImageTextTowers(
        loaded.origin(hf),
        hf.architecture,
        image_tower(request, tower, preprocess, photos, manifest_of, processor_check),
        text,
        preprocess,
        settings,
        image_text_reference(hf, loaded.model, folder, preprocess, settings, tolerance_of(options)),
        photos,
        processor_files,
        {"hf": {"model_type": hf.config["model_type"], "architecture": hf.architecture, "config": CONFIG}},
    )


TASK = ExportTask(
    TASK_IMAGE_TEXT,
    "image-text models (Hugging Face CLIP and SigLIP, open_clip)",
    image_text_job,
    frozenset({"samples"}),
)
