"""A Hugging Face image classifier (`*ForImageClassification`: ViT, DeiT, BEiT, Swin, ConvNeXT, ResNet... as Trainer's
checkpoint-N or a save_pretrained folder; with --hf-config any other layout), exported as an image classifier: its
image processor's resize, crop and normalisation become the manifest's `preprocess`, which the service reproduces,
and its labels come from the config's `id2label`.

The model is served by the image classification task (serve/tasks/image_classification.py), as a torchvision one is:
the same input (a normalised square image) and answer (`logits` over the labels). What differs is only where the
preprocessing comes from, which export/image_processor.py reads and proves against transformers' processor.
"""

from __future__ import annotations

import logging
from functools import partial

import torch
import torch.nn as nn

from contract.manifest import new_manifest
from contract.signature import TASK_IMAGE_CLASSIFICATION
from export.architecture import ModelSpec
from export.exporters import check_eval_mode
from export.hf_text import config_labels, load_hf_text, pipeline_scores
from export.image_processor import check_processor, hf_preprocessing, report
from export.inputs import REAL_IMAGES, real_images
from export.job import Job, log_loading, origin_fields
from export.pipeline import ExportRequest, ExportTask, tolerance_of
from export.readers.hf_checkpoint import processor_folder
from export.reference import IMAGE_PIPELINE_CALL, Reference, image_pipeline_matches
from export.steps import timed
from export.tasks.image_classification import CheckOptions, write_and_check

log = logging.getLogger("export")
AUTO_CLASS = "AutoModelForImageClassification"
IMAGE_PROCESSOR = "image processor, which says how images were resized and normalised"


class PixelLogits(nn.Module):
    """A transformers image classifier called with the normalised image, giving its logits alone."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).logits


def hf_image_job(request: ExportRequest) -> Job:
    options, hf = request.options, request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    folder = processor_folder(hf, IMAGE_PROCESSOR)
    _, pre = hf_preprocessing(folder, options.read.trust_remote_code)
    loaded = load_hf_text(request, hf, AUTO_CLASS)
    model = PixelLogits(loaded.model).eval()
    check_eval_mode(model)
    log_loading(loaded.src, loaded.unwrapped)
    labels, scores = config_labels(hf, loaded.model.config), pipeline_scores(loaded.model.config)
    if scores == "none":
        raise ValueError(f"{hf.config_dir}: a regression head (problem_type regression); handoff serves classifiers")
    preprocess = pre.to_manifest()
    spec = ModelSpec(hf.architecture, len(labels), labels, preprocess, model, loaded.unwrapped)
    origin = origin_fields(request.checkpoint, loaded.src, loaded.unwrapped, loaded.provenance)
    manifest = new_manifest(
        hf.architecture, labels, preprocess, "float16" if options.write.fp16 else "float32", origin, request.timings
    )
    manifest["scores"] = scores  # how the pipeline scores its logits: softmax, or sigmoid for independent labels
    manifest["reference"] = Reference("transformers", IMAGE_PIPELINE_CALL).to_manifest()
    reference = image_pipeline_matches(hf, loaded.model, folder, preprocess, scores, tolerance_of(options, "fp32"))
    checks = CheckOptions.of(options)
    with timed(request.timings, "preprocess_check"):
        photos, _ = real_images(None, options.parity.samples, REAL_IMAGES)
        check = check_processor(folder, model, preprocess, photos, options.read.trust_remote_code)
    if not check.passed:  # the model would be served other pixels than it was trained on
        raise ValueError(f"{folder}: {check.line()}")
    manifest["preprocess_check"] = report(check)
    formats, device = request.options.write.formats, request.device
    notes = (check.line(),)
    write = partial(
        write_and_check, model, spec, None, formats, device, checks, manifest, notes=notes, reference=reference
    )
    described = f"{hf.architecture} ({len(labels)} labels: {', '.join(labels[:4])}) with {check.processor}"
    return Job(manifest, write, described)


TASK = ExportTask(
    TASK_IMAGE_CLASSIFICATION,
    "Hugging Face image classifiers",
    hf_image_job,
    frozenset({"fp16", "int8", "max_accuracy_drop", "samples"}),
)
