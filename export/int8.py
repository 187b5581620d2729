"""INT8 for the CPU: ONNX Runtime's static quantization (QDQ, per-channel weights), calibrated on real images,
and kept only if accuracy holds.

Calibration: up to CALIBRATION_IMAGES images of the training data the checkpoint names (the embedded digits'
train split, an ImageFolder's train/), else of `--samples` (its first half). Evaluation: where labelled
validation data is known (the digits' validation split, an ImageFolder's val/), top-1 accuracy of the fp32
and the INT8 model over all of it; elsewhere top-1 agreement with fp32 on the other half of `--samples`.
The INT8 artifact passes when accuracy drops by at most `max_drop` percentage points.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from onnxruntime.quantization import CalibrationDataReader

from export.inputs import eval_transform_of, image_files, load_images
from train.checkpoint import EMBEDDED_DIGITS

log = logging.getLogger(__name__)

CALIBRATION_IMAGES = 256
EVAL_BATCH = 64


@dataclass
class Int8Report:
    calibration: str  # which images, how many
    evaluation: str
    metric: str  # "top-1 accuracy" (labelled) or "top-1 agreement with fp32"
    fp32_top1: float  # percent
    int8_top1: float
    drop: float  # percentage points
    max_drop: float
    passed: bool

    def line(self) -> str:
        return (
            f"INT8 ({self.metric} on {self.evaluation}): fp32 {self.fp32_top1:.2f}%, int8 {self.int8_top1:.2f}%, "
            f"drop {self.drop:.2f} points (allowed {self.max_drop:g}): {'pass' if self.passed else 'FAIL'}"
        )


@dataclass
class _Sets:
    calibration: torch.Tensor
    calibration_described: str
    evaluation: torch.Tensor
    labels: np.ndarray | None
    evaluation_described: str


def _labelled_folder(root: Path) -> tuple[list[Path], np.ndarray]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files, labels = [], []
    for index, name in enumerate(classes):
        for path in image_files(root / name):
            files.append(path)
            labels.append(index)
    return files, np.array(labels)


def _sets(preprocess: dict[str, Any], data: str | None, samples: Path | None) -> _Sets:
    transform = eval_transform_of(preprocess)

    def batch(images: list) -> torch.Tensor:
        return torch.stack([transform(img) for img in images])

    if data == EMBEDDED_DIGITS:
        from PIL import Image

        from train.data import digits_split

        (x_train, _), (x_val, y_val) = digits_split()
        calib = [Image.fromarray(img).convert("RGB") for img in x_train[:CALIBRATION_IMAGES]]
        val = [Image.fromarray(img).convert("RGB") for img in x_val]
        return _Sets(
            batch(calib),
            f"{len(calib)} digits training images",
            batch(val),
            np.asarray(y_val),
            f"the digits validation set ({len(val)} images)",
        )
    if data and (Path(data) / "train").is_dir() and (Path(data) / "val").is_dir():
        train_files = image_files(Path(data) / "train")
        random.Random(0).shuffle(train_files)
        val_files, labels = _labelled_folder(Path(data) / "val")
        calib = load_images(train_files[:CALIBRATION_IMAGES])
        return _Sets(
            batch(calib),
            f"{len(calib)} images of {data}/train",
            batch(load_images(val_files)),
            labels,
            f"{data}/val ({len(val_files)} images)",
        )
    if samples is None:
        raise ValueError(
            "--int8 needs real images to calibrate on: the checkpoint names no training data, so pass "
            "--samples DIR (a folder of images like those the model will see)"
        )
    files = image_files(samples)
    if len(files) < 4:
        raise ValueError(
            f"--samples={samples}: {len(files)} images; --int8 needs at least 4 (half to calibrate, half to check)"
        )
    half = len(files) // 2
    calib_files, held_out = files[:half][:CALIBRATION_IMAGES], files[half:]
    return _Sets(
        batch(load_images(calib_files)),
        f"{len(calib_files)} images of {samples}",
        batch(load_images(held_out)),
        None,
        f"{len(held_out)} held-out images of {samples}",
    )


class _Reader(CalibrationDataReader):
    """The calibration images, a batch at a time, as ONNX Runtime's quantizer reads them."""

    def __init__(self, images: torch.Tensor, input_name: str) -> None:
        self.batches: Iterator[dict[str, np.ndarray]] = iter(
            {input_name: images[i : i + 32].numpy()} for i in range(0, len(images), 32)
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def _top1(session: Any, images: torch.Tensor) -> np.ndarray:
    name = session.get_inputs()[0].name
    return np.concatenate(
        [
            session.run(None, {name: images[i : i + EVAL_BATCH].numpy()})[0].argmax(1)
            for i in range(0, len(images), EVAL_BATCH)
        ]
    )


def quantize(
    fp32_onnx: Path,
    int8_onnx: Path,
    preprocess: dict[str, Any],
    data: str | None,
    samples: Path | None,
    max_drop: float,
) -> Int8Report:
    """Write `int8_onnx` from `fp32_onnx` and measure what it costs in accuracy."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    sets = _sets(preprocess, data, samples)
    prepared = int8_onnx.with_name(".int8-prepared.onnx")
    try:
        quant_pre_process(str(fp32_onnx), str(prepared), skip_symbolic_shape=True)
        reader = _Reader(sets.calibration, "input")
        # U8S8 (unsigned activations, signed per-channel weights): the pairing ONNX Runtime recommends on x86-64.
        # Weights in 7 bits (reduce_range): on x86-64 CPUs without VNNI, ONNX Runtime's U8S8 kernels add pairs of
        # products in 16 bits, which saturate with 8-bit weights; measured on an AVX2-only EPYC, the digits model
        # lost 3.3 points of top-1 with 8-bit weights. The export may be served on such a CPU whatever built it.
        quantize_static(
            str(prepared),
            str(int8_onnx),
            reader,
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
    finally:
        prepared.unlink(missing_ok=True)
    cpu = ["CPUExecutionProvider"]
    fp32 = _top1(ort.InferenceSession(str(fp32_onnx), providers=cpu), sets.evaluation)
    int8 = _top1(ort.InferenceSession(str(int8_onnx), providers=cpu), sets.evaluation)
    if sets.labels is not None:
        metric, fp32_top1 = "top-1 accuracy", 100 * float((fp32 == sets.labels).mean())
        int8_top1 = 100 * float((int8 == sets.labels).mean())
    else:
        metric, fp32_top1, int8_top1 = "top-1 agreement with fp32", 100.0, 100 * float((int8 == fp32).mean())
    drop = round(fp32_top1 - int8_top1, 4)
    report = Int8Report(
        sets.calibration_described,
        sets.evaluation_described,
        metric,
        fp32_top1,
        int8_top1,
        drop,
        max_drop,
        drop <= max_drop,
    )
    log.info("%s", report.line())
    return report


def report_dict(report: Int8Report) -> dict[str, Any]:
    return asdict(report)
