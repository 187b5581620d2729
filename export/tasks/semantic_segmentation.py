"""Export a torchvision segmenter (FCN, DeepLabV3, LR-ASPP): its checkpoint in, an ONNX graph that takes an image
and gives per-pixel logits, proven against the eager model on real photos.

What torchvision's segmentation references do at evaluation (`SegmentationPresetEval`): resize the image's shorter
side to 520 (bilinear), scale to 0..1, normalize with ImageNet's mean and std, run the model, take `out`. The
resize stays outside the graph (the service does it with Pillow, as the references do on PIL images); the
normalization goes inside, so the graph takes `image` N x 3 x H x W in 0..1 at any H and W and gives `logits`
N x classes x H x W, at the size it was given. The service takes each pixel's best class and maps the mask back
to the uploaded image's size (nearest).

Written and checked as any model is (export/pipeline.py: ONNX, torch.export, TorchScript, each against
eager on the example's rows and at a shorter H and W), the example being the user's images (--samples, as a model
trained on its own domain is best proven on it) or two views of scikit-learn's photos.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from contract.manifest import new_tensor_manifest
from contract.signature import TASK_SEMANTIC_SEGMENTATION
from export.architecture import load_by_heads
from export.inputs import sample_images
from export.job import Job, log_loading, origin_fields
from export.pipeline import ExportRequest, ExportTask, tolerance_of, write_tensor_export
from export.tensor_model import Example, describe

MAX_SAMPLES = 8  # --samples: one batch of them at EXAMPLE_SIZE
EVAL_SIZE = 520  # references/segmentation/presets.py: SegmentationPresetEval(base_size=520)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
EXAMPLE_SIZE = (240, 320)  # parity's example (H, W); the dynamic H and W are checked cut shorter


def segmentation_architectures() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models.segmentation))


def is_segmenter(arch: str | None) -> bool:
    return arch is not None and arch in segmentation_architectures()


class SegmentationGraph(nn.Module):
    """The segmenter as the export runs it: an image in 0..1, normalized here, and the model's `out` logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", torch.tensor(MEAN).reshape(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(STD).reshape(1, 3, 1, 1))

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.model((image - self.mean) / self.std)["out"]}


def _build(arch: str, num_classes: int, aux_loss: bool) -> nn.Module:
    import torchvision

    extra = {"aux_loss": True} if aux_loss else {}  # as references/segmentation/train.py's --aux-loss builds it
    return torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=num_classes, **extra)


def example_images(samples: Path | None = None) -> Example:
    """The user's images (--samples, up to MAX_SAMPLES), else scikit-learn's two photos, at EXAMPLE_SIZE:
    N x 3 x H x W in 0..1."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    height, width = EXAMPLE_SIZE
    found = (
        sample_images(samples, MAX_SAMPLES) if samples else [Image.fromarray(p) for p in load_sample_images().images]
    )
    views = [np.asarray(image.resize((width, height))) for image in found]
    batch = np.stack(views).transpose(0, 3, 1, 2).astype(np.float32) / 255
    return Example({"image": torch.from_numpy(np.ascontiguousarray(batch))}, keywords=False)


def segmentation_job(request: ExportRequest) -> Job:
    """--labels: one name per class index (index 0 is the references' background)."""
    options, src, arch = request.options, request.source, str(request.arch)
    timings, device = request.timings, request.device
    labels, checkpoint, formats = request.options.read.labels, request.checkpoint, request.options.write.formats
    aux_loss = bool(src.preprocess_hints.get("aux_loss")) or any("aux_classifier." in k for k in src.state_dict)
    make = lambda n: _build(arch, n, aux_loss)  # noqa: E731
    model, unwrapped, labels, provenance = load_by_heads(make, src, arch, labels, timings, options.read.allow_partial)
    log_loading(src, unwrapped)
    example = example_images(options.parity.samples)
    dynamic: dict[str, tuple[int, ...]] = {"image": (2, 3)}
    signature, wrapped = describe(SegmentationGraph(model).eval(), example, dynamic)
    origin = origin_fields(checkpoint, src, unwrapped, provenance)
    manifest = new_tensor_manifest(arch, signature, {"image": [2, 3]}, origin, timings)
    settings: dict[str, Any] = {"resize": EVAL_SIZE, "interpolation": "bilinear", "mean": MEAN, "std": STD}
    manifest |= {
        "task": TASK_SEMANTIC_SEGMENTATION,
        "labels": labels,
        "segmentation": settings,
    }
    tolerance = tolerance_of(options)
    return Job(
        manifest,
        lambda out: write_tensor_export(wrapped, example, dynamic, formats, device, tolerance, manifest, out),
        f"{arch} ({len(labels)} classes{', with its aux classifier' if aux_loss else ''})",
    )


TASK = ExportTask(
    TASK_SEMANTIC_SEGMENTATION, "torchvision segmenters", segmentation_job, frozenset({"arch", "labels", "samples"})
)
