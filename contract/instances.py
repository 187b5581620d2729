"""Instance masks as torchvision makes them and as COCO writes them, in NumPy: shared by export (its parity pastes
the graph's masks and compares them with eager's) and serve (/detect's answer), so both compute the same pixels.

Mask R-CNN predicts each detection's mask as M x M probabilities over its box (M = 28). torchvision's postprocess
pastes it into the image: the mask padded by one pixel, its box widened to match, rounded to whole pixels, the mask
resized to the box by bilinear interpolation (torch's, align_corners=False), and cut where it leaves the image
(`paste_mask`). A pixel belongs to the instance where that probability passes 0.5 (torchvision's references and
pycocotools threshold so).

An answer gives each mask as COCO's compressed run-length encoding (`rle`: `{"size": [height, width], "counts": str}`,
the runs of 0s and 1s down the columns, as pycocotools' `mask.encode` writes them), in the upload's own pixels: where
the service gave the model a smaller copy of a large upload, the mask pasted at that size is scaled to the upload's
by nearest neighbour (`rle` with `to_size`), without building the upload-sized picture.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MASK_THRESHOLD = 0.5
PADDING = 1  # torchvision's paste_masks_in_image


def source_index(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch's bilinear source indices and weights along one axis (align_corners=False, no antialiasing)."""
    scale = np.float32(size_in / size_out)
    source = np.maximum((np.arange(size_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5), 0)
    first = np.minimum(source.astype(np.int64), size_in - 1)
    second = np.minimum(first + 1, size_in - 1)
    return first, second, (source - first).astype(np.float32)


def resize_plane(plane: np.ndarray, height: int, width: int) -> np.ndarray:
    """A float32 2-D array resized as torch's `interpolate(mode="bilinear", align_corners=False)` resizes it."""
    top, bottom, down = source_index(plane.shape[0], height)
    left, right, across = source_index(plane.shape[1], width)
    upper = plane[top][:, left] * (1 - across) + plane[top][:, right] * across
    lower = plane[bottom][:, left] * (1 - across) + plane[bottom][:, right] * across
    return upper * (1 - down)[:, None] + lower * down[:, None]


def pasted_box(box: np.ndarray, size: int) -> tuple[int, int, int, int]:
    """Where torchvision pastes an M x M mask (`size` = M) for `box`: the box widened by the mask's padding, in whole
    pixels (float32 arithmetic, then truncation toward zero, as torch's `.to(torch.int64)`), x2 and y2 included."""
    scale = np.float32((size + 2 * PADDING) / size)
    box = box.astype(np.float32)
    half_w, half_h = (box[2] - box[0]) * np.float32(0.5) * scale, (box[3] - box[1]) * np.float32(0.5) * scale
    centre_x, centre_y = (box[2] + box[0]) * np.float32(0.5), (box[3] + box[1]) * np.float32(0.5)
    x1, y1, x2, y2 = (int(v) for v in (centre_x - half_w, centre_y - half_h, centre_x + half_w, centre_y + half_h))
    return x1, y1, x2, y2


def paste_region(mask: np.ndarray, box: np.ndarray, height: int, width: int) -> tuple[int, int, np.ndarray]:
    """One M x M mask of probabilities pasted at `box` (x1, y1, x2, y2) as torchvision's paste_masks_in_image pastes
    it into a `height` x `width` image, but only the part inside the box: (top, left, that part, float32)."""
    x1, y1, x2, y2 = pasted_box(box, mask.shape[-1])
    w, h = max(x2 - x1 + 1, 1), max(y2 - y1 + 1, 1)
    left, right, top, bottom = max(x1, 0), min(x2 + 1, width), max(y1, 0), min(y2 + 1, height)
    if right <= left or bottom <= top:
        return 0, 0, np.zeros((0, 0), dtype=np.float32)
    resized = resize_plane(np.pad(mask.astype(np.float32), PADDING), h, w)
    return top, left, resized[top - y1 : bottom - y1, left - x1 : right - x1]


def paste_mask(mask: np.ndarray, box: np.ndarray, height: int, width: int) -> np.ndarray:
    """The whole `height` x `width` image of `paste_region` (zero outside the box), as torchvision returns it."""
    image = np.zeros((height, width), dtype=np.float32)
    top, left, region = paste_region(mask, box, height, width)
    image[top : top + region.shape[0], left : left + region.shape[1]] = region
    return image


def rle_of_region(region: np.ndarray, top: int, left: int, height: int, width: int) -> dict[str, object]:
    """COCO's compressed RLE of a `height` x `width` mask that is False outside `region` (boolean, its corner at
    `top`, `left`): the changes found in the region's columns, never building the whole picture."""
    h, w = region.shape
    padded = np.zeros((h + 2, w), dtype=bool)  # a False row above and below: the picture's rows top - 1 .. top + h
    padded[1:-1] = region
    at_column, at_row = np.nonzero((padded[1:] != padded[:-1]).T)  # sorted by column, then row
    rows = at_row + top  # the picture's row where the value changes, from the row above
    inside = (rows >= 1) & (rows <= height - 1)  # a change at row 0 is a change across columns, below
    positions = [(at_column[inside] + left) * height + rows[inside]]
    top_row, bottom_row = np.zeros(width, dtype=bool), np.zeros(width, dtype=bool)
    if top == 0 and h:
        top_row[left : left + w] = region[0]
    if top + h == height and h:
        bottom_row[left : left + w] = region[-1]
    positions.append(np.flatnonzero(top_row != np.concatenate([[False], bottom_row[:-1]])) * height)
    return _runs(np.sort(np.concatenate(positions)), height * width, (height, width))


def rle(binary: np.ndarray, to_size: tuple[int, int] | None = None) -> dict[str, object]:
    """COCO's compressed RLE of a boolean H x W mask, or of that mask scaled to `to_size` (height, width) by
    nearest neighbour (pixel centres). The runs are found from the positions where the value changes, down each
    column and from one column's bottom to the next one's top, so the scaled picture is never built."""
    out_h, out_w = to_size or binary.shape
    rows, cols = _nearest(out_h, binary.shape[0]), _nearest(out_w, binary.shape[1])
    used, source = np.unique(cols, return_inverse=True)  # the source columns read, and each output column's
    columns = binary[np.ix_(rows, used)]  # each source column read at the output's height
    at_column, at_row = np.nonzero((columns[1:] != columns[:-1]).T)  # sorted by column, then row
    first = np.searchsorted(at_column, np.arange(len(used) + 1))  # where each source column's changes start
    count = np.diff(first)[source]  # the changes in each output column
    within = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    inside = np.repeat(np.arange(out_w) * out_h, count) + at_row[np.repeat(first[:-1][source], count) + within] + 1
    top, bottom = columns[0][source], columns[-1][source]
    across = np.flatnonzero(top != np.concatenate([[False], bottom[:-1]])) * out_h
    return _runs(np.sort(np.concatenate([inside, across])), out_h * out_w, (out_h, out_w))


def _runs(changes: np.ndarray, total: int, size: tuple[int, int]) -> dict[str, object]:
    """The RLE whose values change at the sorted flat positions `changes` (from False at position 0)."""
    counts = np.diff(np.concatenate([[0], changes, [total]]))
    return {"size": [int(size[0]), int(size[1])], "counts": _compressed(counts.tolist())}


def _nearest(size_out: int, size_in: int) -> np.ndarray:
    return np.minimum(((np.arange(size_out) + 0.5) * size_in / size_out).astype(np.int64), size_in - 1)


def _compressed(counts: list[int]) -> str:
    """pycocotools' rleToString: each count (from the third, less the count two before) in 5-bit groups, low first,
    0x20 marking that more follow, offset by 48 into printable ASCII."""
    out = []
    for i, count in enumerate(counts):
        value = count - counts[i - 2] if i > 2 else count
        more = True
        while more:
            group = value & 0x1F
            value >>= 5  # Python's shift is arithmetic, as the C code's on a long
            more = value != -1 if group & 0x10 else value != 0
            out.append(chr((group | 0x20 if more else group) + 48))
    return "".join(out)


def decoded(encoded: dict[str, Any]) -> np.ndarray:
    """The boolean mask a compressed RLE describes (the inverse of `rle`, for tests and clients in Python)."""
    text = str(encoded["counts"])
    height, width = (int(v) for v in encoded["size"])
    counts: list[int] = []
    position = 0
    while position < len(text):
        value, shift, more = 0, 0, True
        while more:
            group = ord(text[position]) - 48
            value |= (group & 0x1F) << (5 * shift)
            more = bool(group & 0x20)
            position, shift = position + 1, shift + 1
            if not more and group & 0x10:
                value |= -1 << (5 * shift)
        counts.append(value + counts[-2] if len(counts) > 2 else value)
    flat = np.repeat(np.arange(len(counts)) % 2 == 1, counts)
    return flat.reshape(width, height).T
