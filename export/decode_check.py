"""What JPEG draft decoding (DCT scaling) does to the model's answers, measured at export time like INT8.

A 12-megapixel photo costs ~190 ms to decode exactly and resize to 256 on one core here, and ~18 ms with
Pillow's draft mode, which decodes the JPEG at 1/2, 1/4 or 1/8 of its size (never below the resize target)
and so skips most of the work; the pixels then differ a little from the exact path (a mean of 0.8/255 on one
photo). The service uses that fast path only where this check passed (`manifest["decode"]`), only for JPEGs at
least twice the resize target, and never with HANDOFF_DECODE=exact.

The check: real images (the parity check's own: the training data's validation images, else scikit-learn's
sample photos), each saved as a JPEG large enough to take the fast path (scaled up to four times the resize
target where smaller), decoded both ways and classified by the eager model: top-1 agreement, and the largest
difference in any class's probability.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from contract.pil_transform import Preprocessor

MIN_AGREEMENT = 0.995  # top-1 agreement with the exact path, the goal the fast path must meet
MAX_PIXELS = 10**9  # the check's own images: no request limit applies


@dataclass(frozen=True)
class DecodeCheck:
    images: int
    sizes: str  # e.g. "1024x683 .. 1600x1067"
    top1_agreement: float
    max_probability_difference: float
    mean_pixel_difference: float  # on the model's input, in units of 1/255 before normalisation
    min_agreement: float
    passed: bool

    def line(self) -> str:
        verdict = "pass: served with HANDOFF_DECODE=auto" if self.passed else "FAIL: large JPEGs decoded exactly"
        return (
            f"  fast JPEG decode (draft) on {self.images} real images ({self.sizes}): top-1 agreement "
            f"{100 * self.top1_agreement:.1f}%, largest probability difference {self.max_probability_difference:.4f}; "
            f"{verdict}"
        )


def _as_large_jpeg(image: Image.Image, resize: int) -> bytes:
    """`image` as a JPEG (quality 90) whose shorter side is at least 4 x `resize`: the fast path's territory."""
    short = min(image.size)
    if short < 4 * resize:
        scale = 4 * resize / short
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def check_fast_decode(model: nn.Module, preprocess: dict[str, Any], images: list[Image.Image]) -> DecodeCheck:
    pipeline = Preprocessor.from_manifest(preprocess, MAX_PIXELS)
    jpegs = [_as_large_jpeg(image, pipeline.resize) for image in images]
    exact = np.stack([pipeline(pipeline.decode(data)) for data in jpegs])
    fast = np.stack([pipeline(pipeline.decode(data, fast=True)) for data in jpegs])
    with torch.inference_mode():
        p_exact = torch.softmax(model(torch.from_numpy(exact)), 1).numpy()
        p_fast = torch.softmax(model(torch.from_numpy(fast)), 1).numpy()
    agreement = float((p_exact.argmax(1) == p_fast.argmax(1)).mean())
    std = pipeline.std.reshape(1, -1, 1, 1)
    sizes = sorted(Image.open(io.BytesIO(data)).size for data in jpegs)
    return DecodeCheck(
        images=len(jpegs),
        sizes=f"{sizes[0][0]}x{sizes[0][1]} .. {sizes[-1][0]}x{sizes[-1][1]}",
        top1_agreement=agreement,
        max_probability_difference=float(np.abs(p_exact - p_fast).max()),
        mean_pixel_difference=float(np.abs((exact - fast) * std).mean() * 255),
        min_agreement=MIN_AGREEMENT,
        passed=agreement >= MIN_AGREEMENT,
    )


def report(check: DecodeCheck) -> dict[str, Any]:
    """The manifest's `decode` block."""
    return {"fast": {"method": "Pillow JPEG draft mode (DCT scaling), never below the resize target", **asdict(check)}}
