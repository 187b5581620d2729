"""curves.png (train/curves.py): a PNG with both series drawn, for one epoch, many, and values a log scale
cannot show (a NaN loss, a zero)."""

import io

import numpy as np
import pytest
from PIL import Image

from train.curves import HEIGHT, SERIES_COLORS, WIDTH, Panel, draw_curves


def colour_counts(epochs: int) -> tuple[tuple[int, int], list[int]]:
    numbers = list(range(1, epochs + 1))
    loss = {"train": [2.0 / e for e in numbers], "val": [float("nan") if e == 2 else 1.0 / e for e in numbers]}
    accuracy = {"train": [min(100.0, 40.0 + e) for e in numbers], "val": [0.0, *[90.0] * (epochs - 1)][:epochs]}
    png = draw_curves(
        numbers,
        [Panel("loss", "cross-entropy", loss, log_scale=True), Panel("accuracy", "%", accuracy, y_range=(0, 100))],
    )
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG"
    pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
    return image.size, [int((pixels == color).all(axis=1).sum()) for color in SERIES_COLORS.values()]


@pytest.mark.parametrize("epochs", [1, 5, 200])
def test_both_series_are_drawn(epochs):
    size, counts = colour_counts(epochs)
    _, legend_only = colour_counts(0)
    assert size == (WIDTH, HEIGHT)
    for drawn, legend in zip(counts, legend_only, strict=True):
        assert drawn > legend + 20, (epochs, counts, legend_only)  # the data's own pixels, beyond the legend's
