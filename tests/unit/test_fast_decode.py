"""Fast JPEG decoding (contract/pil_transform.py): used only for JPEGs at least twice the resize target, never
below it, and close to the exact path; everything else decodes exactly as before."""

import io

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_sample_images

from contract.pil_transform import Preprocessor

SPEC = {
    "resize": 256,
    "crop": 224,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "interpolation": "bilinear",
    "channels": 3,
}


def encoded(size: tuple[int, int], fmt: str = "JPEG") -> bytes:
    photo = Image.fromarray(load_sample_images().images[0]).resize(size, Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    photo.save(buffer, fmt, quality=90) if fmt == "JPEG" else photo.save(buffer, fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def pipeline():
    return Preprocessor.from_manifest(SPEC, max_pixels=10**9)


def test_a_phone_photo_is_decoded_at_a_reduced_scale_close_to_the_exact_path(pipeline):
    data = encoded((4032, 3024))
    fast_image, exact_image = pipeline.decode(data, fast=True), pipeline.decode(data)
    assert exact_image.size == (4032, 3024)
    assert min(fast_image.size) >= 256 and fast_image.size[0] < 4032 / 2, fast_image.size
    difference = np.abs((pipeline(fast_image) - pipeline(exact_image)) * pipeline.std).mean() * 255
    assert difference < 2.0, f"mean difference {difference:.2f}/255"


@pytest.mark.parametrize("size, fmt", [((500, 400), "JPEG"), ((4032, 3024), "PNG")])
def test_small_jpegs_and_other_formats_decode_exactly(pipeline, size, fmt):
    data = encoded(size, fmt)
    np.testing.assert_array_equal(pipeline(pipeline.decode(data, fast=True)), pipeline(pipeline.decode(data)))
