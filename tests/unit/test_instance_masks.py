"""contract/instances.py against the code it reproduces: torchvision's paste_masks_in_image and pycocotools' RLE;
and the service's mask of a box too large to paste at the upload's pixels."""

from __future__ import annotations

import numpy as np
import torch
from pycocotools import mask as coco_mask
from torchvision.models.detection.roi_heads import paste_masks_in_image

from contract.instances import decoded, paste_mask, rle, rle_of_region
from serve.tasks.object_detection import MASK_PIXELS, Frame


def coco(binary: np.ndarray) -> str:
    return coco_mask.encode(np.asfortranarray(binary.astype(np.uint8)))["counts"].decode()


def test_a_mask_is_pasted_as_torchvision_pastes_it():
    rng = np.random.default_rng(0)
    for _ in range(100):
        masks = torch.rand(1, 1, 28, 28)
        height, width = (int(v) for v in rng.integers(20, 300, 2))
        x1, y1 = rng.uniform(0, width), rng.uniform(0, height)
        x2, y2 = min(x1 + rng.uniform(0.1, 250), width), min(y1 + rng.uniform(0.1, 250), height)
        box = torch.tensor([[x1, y1, x2, y2]], dtype=torch.float32)
        theirs = paste_masks_in_image(masks, box, (height, width))[0, 0].numpy()
        np.testing.assert_allclose(paste_mask(masks[0, 0].numpy(), box[0].numpy(), height, width), theirs, atol=1e-5)


def test_run_length_codes_are_cocos():
    """Whole masks, a region placed in a larger picture, and a mask scaled by nearest neighbour: each decoded by
    pycocotools as the picture it stands for."""
    rng = np.random.default_rng(1)
    for trial in range(200):
        height, width = (int(v) for v in rng.integers(1, 40, 2))
        binary = rng.random((height, width)) > rng.random()
        binary[:, : trial % 3] = trial % 2 == 0
        assert rle(binary)["counts"] == coco(binary)
        assert (decoded(rle(binary)) == binary).all()
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        region = binary[: height - top, : width - left]
        placed = np.zeros_like(binary)
        placed[top:, left:] = region
        assert rle_of_region(region, top, left, height, width)["counts"] == coco(placed)
        to = (int(rng.integers(1, 90)), int(rng.integers(1, 90)))
        rows = np.minimum(((np.arange(to[0]) + 0.5) * height / to[0]).astype(int), height - 1)
        cols = np.minimum(((np.arange(to[1]) + 0.5) * width / to[1]).astype(int), width - 1)
        assert rle(binary, to)["counts"] == coco(binary[np.ix_(rows, cols)])


def test_a_box_too_large_to_paste_at_the_uploads_pixels_is_scaled_from_the_models():
    """A 4000 x 3000 upload the model saw at 320 x 240, one box over most of it: its mask pasted at 320 x 240 and
    scaled, equal to the paste at the upload's pixels but for a band of one model pixel at the edge."""
    from scipy.ndimage import binary_dilation, binary_erosion

    frame = Frame(upload=(3000, 4000), model_input=(240, 320))
    small = np.zeros((28, 28), dtype=np.float32)
    small[4:24, 6:20] = 1.0
    box = np.array([20.0, 10.0, 300.0, 230.0], dtype=np.float32)
    assert (300 - 20) * 12.5 * (230 - 10) * 12.5 > MASK_PIXELS
    answer = frame.mask(small, box)
    assert answer["size"] == [3000, 4000]
    ours = decoded(answer)
    exact = paste_mask(small, frame.boxes(box), 3000, 4000) > 0.5
    edge = binary_dilation(exact, iterations=14) & ~binary_erosion(exact, iterations=14)
    assert ours.any() and not ((ours ^ exact) & ~edge).any()


def test_mask_parity_fails_a_mask_from_elsewhere_and_passes_its_own():
    """export/instance_parity.py: the graph's mask pasted as served against eager's; the same mask passes, another
    one (a detection's mask swapped for a different shape, as a wrong output order would give) fails."""
    from export.instance_parity import InstanceGaps

    small = np.zeros((28, 28), dtype=np.float32)
    small[2:26, 2:14] = 0.9  # the left half of the box
    box = np.array([40.0, 30.0, 200.0, 150.0], dtype=np.float32)
    eager = {"masks": paste_mask(small, box, 240, 320)[None], "boxes": box[None]}
    same = InstanceGaps()
    same.add(eager, {"masks": small[None], "boxes": box[None]}, ((0, 0),), "test")
    assert same.reason is None and same.masks == 1
    other = InstanceGaps()
    other.add(eager, {"masks": small[:, ::-1][None], "boxes": box[None]}, ((0, 0),), "test")  # the right half
    assert other.reason is not None and "disagree" in other.reason
