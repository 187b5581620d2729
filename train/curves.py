"""curves.png: loss (log scale) and top-1 accuracy per epoch, train and validation, drawn with Pillow.

Why not matplotlib: on rank 0 its import and first figure take about 0.6 s of CPU and each redraw 0.2 s,
taken from training on a machine whose cores all train (measured: up to 1.9 s of a 30 s five-epoch run,
bench/trainer_overhead.py). Two line charts need none of it; this draws one in a few milliseconds.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 1000, 400
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 20, 40, 50
SERIES_COLORS = {"train": (31, 119, 180), "val": (255, 127, 14)}  # the colours people know from matplotlib
MARKERS_UP_TO = 30  # epochs: past this, dots would hide the line
GRID, AXIS, TEXT = (225, 225, 225), (60, 60, 60), (20, 20, 20)


@dataclass
class Panel:
    title: str
    y_label: str
    series: dict[str, Sequence[float]]  # name -> one value per epoch
    log_scale: bool = False
    y_range: tuple[float, float] | None = None  # fixed bounds (accuracy: 0-100), else from the data


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _ticks(low: float, high: float, most: int) -> list[float]:
    """Round values (multiples of 1, 2 or 5 x 10^k) from low to high, at most `most` of them."""
    step = 10 ** math.floor(math.log10((high - low) / most))
    step *= next(m for m in (1, 2, 5, 10) if (high - low) / (step * m) <= most)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _y_ticks(low: float, high: float, log_scale: bool) -> list[float]:
    if log_scale:
        return [10.0**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)]
    return _ticks(low, high, 6)


def _tick_label(value: float) -> str:
    return f"{value:g}" if value == 0 or abs(value) >= 1e-3 else f"{value:.0e}"


def _draw_panel(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], epochs: Sequence[int], panel: Panel) -> None:
    left, top, right, bottom = box

    def plottable(value: float) -> bool:  # a NaN loss, or a zero on a log scale, is left out
        return math.isfinite(value) and (value > 0 or not panel.log_scale)

    values = [v for vs in panel.series.values() for v in vs if plottable(v)]
    if panel.y_range is not None:
        low, high = panel.y_range
    elif values:
        low, high = min(values), max(values)
        if panel.log_scale:
            low, high = 10 ** math.floor(math.log10(low)), 10 ** math.ceil(math.log10(high))
    else:
        low, high = (0.1, 10.0) if panel.log_scale else (0.0, 1.0)
    if high <= low:
        low, high = (low / 10, high * 10) if panel.log_scale else (low - 1, high + 1)
    scale: Callable[[float], float] = math.log10 if panel.log_scale else float
    first, last = (epochs[0], max(epochs[-1], epochs[0] + 1)) if epochs else (0, 1)

    def point(epoch: float, value: float) -> tuple[float, float]:
        x = left + (epoch - first) / (last - first) * (right - left)
        y = bottom - (scale(value) - scale(low)) / (scale(high) - scale(low)) * (bottom - top)
        return x, y

    small, large = _font(12), _font(15)
    for tick in _y_ticks(low, high, panel.log_scale):
        _, y = point(first, tick)
        draw.line([(left, y), (right, y)], fill=GRID)
        draw.text((left - 6, y), _tick_label(tick), fill=TEXT, font=small, anchor="rm")
    for epoch in [e for e in _ticks(first, last, 10) if e == int(e)]:
        x, _ = point(epoch, low)
        draw.line([(x, top), (x, bottom)], fill=GRID)
        draw.text((x, bottom + 6), f"{epoch:g}", fill=TEXT, font=small, anchor="mt")
    draw.rectangle(box, outline=AXIS)
    draw.text(((left + right) / 2, top - 10), panel.title, fill=TEXT, font=large, anchor="md")
    draw.text(((left + right) / 2, bottom + 26), "epoch", fill=TEXT, font=small, anchor="mt")
    draw.text((left - 50, top - 10), panel.y_label, fill=TEXT, font=small, anchor="ld")
    drawn: list[tuple[float, float]] = []
    for name, series in panel.series.items():
        color = SERIES_COLORS.get(name, AXIS)
        points = [point(e, v) for e, v in zip(epochs, series, strict=True) if plottable(v)]
        points = [(x, min(max(y, top), bottom)) for x, y in points]  # a value outside the range sits on its edge
        if len(points) > 1:
            draw.line(points, fill=color, width=2)
        for x, y in points if len(points) <= MARKERS_UP_TO else []:
            draw.ellipse([(x - 3, y - 3), (x + 3, y + 3)], fill=color)
        drawn += points
    # The legend goes last, on top, in the right-hand corner (upper or lower) that the curves cross least.
    height = 18 * len(panel.series) + 4
    corners = [top + 2, bottom - 2 - height]
    legend_top = min(
        corners, key=lambda y0: sum(x >= right - 90 and y0 - 10 <= y <= y0 + height + 10 for x, y in drawn)
    )
    draw.rectangle([(right - 78, legend_top), (right - 4, legend_top + height)], fill="white", outline=GRID)
    for row, name in enumerate(panel.series):
        legend_y = legend_top + 10 + 18 * row
        draw.line([(right - 70, legend_y), (right - 50, legend_y)], fill=SERIES_COLORS.get(name, AXIS), width=2)
        draw.text((right - 44, legend_y), name, fill=TEXT, font=small, anchor="lm")


def draw_curves(epochs: Sequence[int], panels: Sequence[Panel]) -> bytes:
    """PNG bytes of the panels side by side, one x position per epoch."""
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    width = WIDTH // max(len(panels), 1)
    for i, panel in enumerate(panels):
        box = (i * width + MARGIN_LEFT, MARGIN_TOP, (i + 1) * width - MARGIN_RIGHT, HEIGHT - MARGIN_BOTTOM)
        _draw_panel(draw, box, epochs, panel)
    png = io.BytesIO()
    image.save(png, format="PNG")
    return png.getvalue()
