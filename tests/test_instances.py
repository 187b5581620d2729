"""Mask R-CNN and Keypoint R-CNN end to end: each trained by a plain DDP script under torchrun (2 gloo processes), saved
in the detection references' layout, exported with no flags, served, and answering /detect and the protocol: masks
as COCO's RLE (decoded here with pycocotools, COCO's own code) and keypoints in the upload's pixels, equal to the eager
torchvision model on pictures the export never saw."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import torchvision
import tritonclient.http as triton
from conftest import Server, png_bytes
from PIL import Image
from pycocotools import mask as coco_mask

from contract.instances import paste_mask, rle
from contract.manifest import read_manifest_unchecked
from export.detection_parity import Detections, match_detections

pytestmark = pytest.mark.xdist_group("instances")
BUILD = {"min_size": 160, "max_size": 214, "weights": None, "weights_backbone": None}


def picture(width: int, height: int, seed: int) -> Image.Image:
    """Grey noise with two coloured rectangles, as the fixture trains on, at another size."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(0.5 + 0.05 * rng.standard_normal((height, width, 3)), 0, 1)
    pixels[height // 5 : height // 2, width // 6 : width // 2] = (0.9, 0.1, 0.1)
    pixels[height // 2 : 4 * height // 5, width // 2 : 5 * width // 6] = (0.1, 0.2, 0.9)
    return Image.fromarray((pixels * 255).round().astype(np.uint8))


def eager_model(checkpoint: Path, arch: str, **build):
    model = torchvision.models.get_model(arch, **BUILD, **build)
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=False)["model"])
    return model.eval()


def eager_found(model, image: Image.Image) -> dict[str, np.ndarray]:
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255
    with torch.no_grad():
        return {k: v.numpy() for k, v in model([torch.from_numpy(pixels)])[0].items()}


def detect(url: str, image: Image.Image) -> list[dict]:
    answer = httpx.post(f"{url}/detect", content=png_bytes(image), headers={"Content-Type": "image/png"}, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()["detections"]


def pairs(eager: dict[str, np.ndarray], served: list[dict]) -> list[tuple[int, int]]:
    """The export's matching rule (export/detection_parity.py): the 10 best all matched."""
    theirs = Detections(eager["boxes"], eager["scores"], eager["labels"])
    ours = Detections(
        np.array([d["box"] for d in served], dtype=np.float32).reshape(-1, 4),
        np.array([d["score"] for d in served], dtype=np.float32),
        np.array([d["index"] for d in served], dtype=np.int64),
    )
    found = match_detections(theirs, ours, 0.05, 100, 0.5)
    assert found.reason is None and found.matched >= 0.9 * found.of > 0, (found.reason, found.matched, found.of)
    return list(found.pairs)


def disagreement(a: np.ndarray, b: np.ndarray) -> float:
    either = (a | b).sum()
    return float((a ^ b).sum() / either) if either else 0.0


@pytest.fixture(scope="module")
def mask_server(instance_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("masks") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(instance_run / "mask" / "checkpoint.export")) as srv:
        srv.wait_ready()
        yield srv


@pytest.fixture(scope="module")
def keypoint_server(instance_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("keypoints") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(instance_run / "keypoint" / "checkpoint.export")) as srv:
        srv.wait_ready()
        yield srv


def test_both_export_with_no_flags_and_prove_masks_and_keypoints(instance_run: Path):
    for kind, output in (("mask", "masks"), ("keypoint", "keypoints")):
        manifest = read_manifest_unchecked(instance_run / kind / "checkpoint.export")
        assert manifest["status"] == "passed", manifest["parity"]["summary"]
        assert manifest["detection"]["min_size"] == [160] and manifest["detection"]["max_size"] == 214
        assert output in [o["name"] for o in manifest["signature"]["outputs"]]
        assert any(line.startswith(f"{output} of ") for line in manifest["parity"]["summary"]), manifest["parity"]
        assert manifest["provenance"]["pass"]
    assert read_manifest_unchecked(instance_run / "keypoint" / "checkpoint.export")["detection"]["keypoints"] == 4


def test_detect_answers_masks_as_eager_pastes_them(mask_server, instance_run: Path):
    model = eager_model(instance_run / "mask" / "checkpoint.pth", "maskrcnn_resnet50_fpn", num_classes=3)
    image = picture(300, 220, seed=1)  # as it is: the model's own resize
    eager, served = eager_found(model, image), detect(mask_server.url, image)
    worst = 0.0
    for i, j in pairs(eager, served):
        ours = coco_mask.decode(served[j]["mask"]).astype(bool)  # COCO's own decoder
        assert served[j]["mask"]["size"] == [220, 300]
        worst = max(worst, disagreement(ours, eager["masks"][i, 0] > 0.5))
    assert worst <= 0.02, worst


def test_a_large_upload_gets_its_masks_in_its_own_pixels(mask_server, instance_run: Path):
    """1200 x 880: the service gives the model a copy at its input size (214 x 156) and pastes each mask at its box
    scaled to the upload's pixels; eager resizes the upload's floats itself. Their boxes differ by a fraction of a
    model pixel, so their masks differ only within a band at the edge, one model pixel (about 6 of the upload's) and
    one more wide."""
    from scipy.ndimage import binary_dilation, binary_erosion

    model = eager_model(instance_run / "mask" / "checkpoint.pth", "maskrcnn_resnet50_fpn", num_classes=3)
    image = picture(1200, 880, seed=2)
    eager, served = eager_found(model, image), detect(mask_server.url, image)
    reach = int(np.ceil(1200 / 214)) + 1
    for i, j in pairs(eager, served)[:10]:
        assert served[j]["mask"]["size"] == [880, 1200]
        ours = coco_mask.decode(served[j]["mask"]).astype(bool)
        theirs = eager["masks"][i, 0] > 0.5
        edge = binary_dilation(theirs, iterations=reach) & ~binary_erosion(theirs, iterations=reach)
        assert not ((ours ^ theirs) & ~edge).any(), f"detection {i}: pixels apart from the mask's edge differ"


def test_the_protocol_gives_masks_over_their_boxes(mask_server):
    """detection_masks: the M x M probabilities; pasted at their boxes as torchvision pastes them, /detect's masks."""
    image = picture(300, 220, seed=3)
    client = triton.InferenceServerClient(mask_server.url.removeprefix("http://"))
    images = triton.InferInput("image", [1, 1], "BYTES")
    images.set_data_from_numpy(np.array([[png_bytes(image)]], dtype=object))
    result = client.infer("handoff", [images])
    count, boxes, masks = (result.as_numpy(n) for n in ("num_detections", "detection_boxes", "detection_masks"))
    assert masks.shape == (1, 100, 28, 28) and count[0] > 0
    served = detect(mask_server.url, image)
    for k in range(int(count[0])):
        pasted = paste_mask(masks[0, k], boxes[0, k], 220, 300) > 0.5
        assert rle(pasted) == served[k]["mask"]


def test_detect_answers_keypoints_in_the_uploads_pixels(keypoint_server, instance_run: Path):
    model = eager_model(
        instance_run / "keypoint" / "checkpoint.pth", "keypointrcnn_resnet50_fpn", num_classes=2, num_keypoints=4
    )
    for image in (picture(300, 220, seed=4), picture(1000, 700, seed=5)):  # as it is, and resized by the service
        eager, served = eager_found(model, image), detect(keypoint_server.url, image)
        tolerance = 1e-3 if image.size == (300, 220) else 0.02 * image.size[0]  # the resize's sub-pixel shifts
        for i, j in pairs(eager, served)[:10]:
            ours = np.array(served[j]["keypoints"])
            assert ours.shape == (4, 3)
            np.testing.assert_allclose(ours[:, :2], eager["keypoints"][i][:, :2], atol=tolerance)
