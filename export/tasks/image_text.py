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

import numpy as np
import torch
import torch.nn as nn

from contract.image_text import ImageTextSettings
from contract.pil_transform import Preprocessor
from contract.signature import TASK_IMAGE_TEXT
from contract.tokenizer_spec import TOKENIZER_JSON
from export.hf_text import LoadedText, hf_manifest, load_hf_text, tokenized_job, training_tokenizer
from export.image_processor import check_processor, hf_preprocessing, report
from export.inputs import REAL_IMAGES, real_images
from export.job import Job, log_loading
from export.open_clip import open_clip_job
from export.pipeline import (
    Check,
    ExportRequest,
    ExportTask,
    OwnChecks,
    tolerance_of,
    write_tensor_export,
)
from export.readers.hf_checkpoint import CONFIG, PROCESSOR_CONFIGS, HfCheckpoint, processor_folder
from export.reference import image_text_reference
from export.steps import timed
from export.tensor_model import Example, describe
from export.towers import towers_manifest, write_towers

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


def settings_of(model: Any) -> ImageTextSettings:
    """The zero-shot settings of the model as loaded: its exponentiated logit scale, its bias (SigLIP), and how the
    pipeline scores (a sigmoid for SigLIP, as the pipeline decides by the model type)."""
    bias = float(model.logit_bias.detach().reshape(-1)[0]) if getattr(model, "logit_bias", None) is not None else 0.0
    siglip = "siglip" in str(model.config.model_type)
    return ImageTextSettings(float(model.logit_scale.detach().exp()), bias, "sigmoid" if siglip else "softmax")


def image_text_job(request: ExportRequest) -> Job:
    if request.open_clip is not None:
        return open_clip_job(request, request.open_clip)
    options, hf = request.options, request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    folder = processor_folder(hf, PROCESSOR)
    preprocess = hf_preprocessing(folder, options.read.trust_remote_code)[1].to_manifest()
    loaded = load_hf_text(request, hf, "AutoModel")
    tokenizer = training_tokenizer(request, hf, loaded, "image-text model")
    settings = settings_of(loaded.model)
    tol = tolerance_of(options)
    text = tokenized_job(
        request, hf, loaded, tokenizer, TextFeatures(loaded.model), {}, "the text tower", reference=None
    )
    photos, _ = real_images(None, options.parity.samples, REAL_IMAGES)
    image = _image_tower(request, hf, loaded, folder, preprocess, photos)
    reference = image_text_reference(hf, loaded.model, folder, preprocess, settings, tol)
    towers = {"image": image, "text": text}
    manifest = towers_manifest(request, loaded.origin(hf), hf.architecture, towers, TASK_IMAGE_TEXT)
    manifest |= {"preprocess": preprocess, "tokenizer": text.manifest["tokenizer"]}
    manifest["image_text"] = settings.to_manifest()
    width = int(image.manifest["signature"]["outputs"][0]["shape"][-1])
    manifest["embedding"] = {"pooling": "the model's projection", "normalized": False, "dimensions": width}
    manifest["reference"] = reference.to_manifest()
    manifest["hf"] = {"model_type": hf.config["model_type"], "architecture": hf.architecture, "config": CONFIG}

    def files(out: Path) -> list[str]:
        """The processor's config, and the served tokenizer beside the outer manifest, as a text model's."""
        copied = [name for name in PROCESSOR_CONFIGS if (folder / name).is_file()]
        for name in copied:
            shutil.copyfile(folder / name, out / name)
        shutil.copyfile(out / "text" / TOKENIZER_JSON, out / TOKENIZER_JSON)
        return [*copied, TOKENIZER_JSON]

    assert reference.checks is not None
    checks = reference.checks

    def write(out: Path) -> int:
        return write_towers(out, manifest, towers, "image_text", lambda out: checks(photos, out), files)

    described = (
        f"{hf.architecture} (image tower {'x'.join(map(str, image.manifest['signature']['inputs'][0]['shape'][1:]))}, "
        f"text tower of {text.manifest['tokenizer']['max_length']} tokens; zero-shot by {settings.scores})"
    )
    return Job(manifest, write, described)


def _image_tower(
    request: ExportRequest,
    hf: HfCheckpoint,
    loaded: LoadedText,
    folder: Path,
    preprocess: dict[str, Any],
    photos: list[Any],
) -> Job:
    """The image tower as an export of its own: real photos preprocessed as the service does them, the processor's
    pixels checked against the service's."""
    options = request.options
    tower = ImageFeatures(loaded.model).eval()
    served = Preprocessor.from_manifest(preprocess, max_pixels=1 << 40)
    rows = np.stack([served(photo) for photo in photos]).astype(np.float32)
    example = Example({"pixel_values": torch.from_numpy(rows)}, keywords=True)
    dynamic: dict[str, tuple[int, ...]] = {"pixel_values": ()}
    signature, wrapped = describe(tower, example, dynamic)
    log_loading(loaded.src, loaded.unwrapped)
    manifest = hf_manifest(hf, signature, dynamic, loaded.src, loaded.unwrapped, loaded.provenance, request.timings)
    manifest["preprocess"] = preprocess

    def processor_checks(out: Path) -> tuple[list[str], list[Check]]:
        with timed(manifest["timings"], "preprocess_check"):
            check = check_processor(folder, ImageEmbeds(tower), preprocess, photos, options.read.trust_remote_code)
        manifest["preprocess_check"] = report(check)
        return [], [("image processor", None if check.passed else check.line())]

    def write(out: Path) -> int:
        own = OwnChecks("image", processor_checks)
        formats, tol = options.write.formats, tolerance_of(options)
        return write_tensor_export(wrapped, example, dynamic, formats, request.device, tol, manifest, out, own)

    return Job(manifest, write, "the image tower")


TASK = ExportTask(
    TASK_IMAGE_TEXT,
    "image-text models (Hugging Face CLIP and SigLIP, open_clip)",
    image_text_job,
    frozenset({"samples"}),
)
