"""torchvision segmenters end to end: a DeepLabV3 with its auxiliary classifier trained by a plain DDP script
(torchrun, 2 gloo processes, tests/fixtures/segmentation_ddp.py), its checkpoint in the layout of torchvision's
segmentation references exported with no flags and its DDP state_dict with --arch, served, and answering /segment
and the protocol (tritonclient, BYTES images) as the eager model does, evaluated as the references evaluate."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import torchvision
import tritonclient.http as triton
from conftest import Server, photo_jpegs, png_bytes, probe_timeout_s, run
from PIL import Image
from test_serve_attacks_round3 import slowest_probe_during

from contract.manifest import read_manifest_unchecked

pytestmark = pytest.mark.xdist_group("segmentation")
ARCH = "deeplabv3_mobilenet_v3_large"
SIZES = ((400, 267), (300, 450))  # width x height
MEAN, STD = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]


@pytest.fixture(scope="module")
def trained(segmentation_run: Path) -> Path:
    return segmentation_run


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    return photo_jpegs(SIZES)


@pytest.fixture(scope="module")
def eager(trained: Path):
    """The trained model evaluated as torchvision's references evaluate it (shorter side resized to 520 with PIL,
    normalized, `out`'s best class), the mask mapped back to the photo's size (nearest)."""
    model = torchvision.models.get_model(ARCH, weights=None, weights_backbone=None, num_classes=3, aux_loss=True)
    model.load_state_dict(torch.load(trained / "checkpoint.pth", map_location="cpu", weights_only=False)["model"])
    model.eval()

    def segment(jpeg: bytes) -> np.ndarray:
        image = Image.open(io.BytesIO(jpeg)).convert("RGB")
        resized = torchvision.transforms.functional.resize(image, 520)
        x = (torchvision.transforms.functional.to_tensor(resized) - MEAN) / STD
        with torch.no_grad():
            classes = model(x[None])["out"][0].argmax(0).numpy().astype(np.uint8)
        return np.asarray(Image.fromarray(classes).resize(image.size, Image.Resampling.NEAREST))

    return segment


@pytest.fixture(scope="module")
def server(trained: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("segmentation_serve") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(trained / "checkpoint.export")) as srv:
        srv.wait_ready()
        yield srv


def mask_of(server, jpeg: bytes) -> np.ndarray:
    answer = httpx.post(f"{server.url}/segment", content=jpeg, headers={"Content-Type": "image/jpeg"}, timeout=60)
    assert answer.status_code == 200 and answer.headers["content-type"] == "image/png", answer.text[:300]
    return np.asarray(Image.open(io.BytesIO(answer.content)))


def test_the_references_checkpoint_exports_with_no_flags(trained: Path):
    manifest = read_manifest_unchecked(trained / "checkpoint.export")
    assert manifest["task"] == "semantic-segmentation" and manifest["status"] == "passed"
    assert manifest["arch"] == ARCH and manifest["labels"] == ["0", "1", "2"]
    assert manifest["source"]["container"] == "torchvision-reference"
    assert manifest["segmentation"]["resize"] == 520 and manifest["segmentation"]["interpolation"] == "bilinear"
    assert {r["artifact"] for r in manifest["parity"]["results"]} == {"model.onnx", "model.pt2", "model.torchscript.pt"}
    assert all(r["passed"] for r in manifest["parity"]["results"])
    logits = next(t for t in manifest["signature"]["outputs"] if t["name"] == "logits")
    assert logits["shape"] == [-1, 3, -1, -1], "H and W follow the image's: -1, not the example's size"
    state = read_manifest_unchecked(trained / "ddp_state.export")
    assert state["status"] == "passed" and state["source"]["removed_prefixes"] == ["module."]


def test_a_segmenter_is_proved_on_the_users_own_images(trained: Path, tmp_path: Path):
    """--samples gives parity the user's images (three here, at the example's size) in place of scikit-learn's."""
    own = tmp_path / "own"
    own.mkdir()
    generator = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(generator.integers(0, 255, (100 + 10 * i, 140, 3), dtype=np.uint8)).save(own / f"{i}.png")
    out = tmp_path / "own.export"
    done = run(
        [sys.executable, "-m", "export", str(trained / "checkpoint.pth"), "--samples", str(own)]
        + ["--out", str(out), "--no-bento", "--formats", "onnx"]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    parity = read_manifest_unchecked(out)["parity"]
    assert parity["pass"] and "image float32 [3, 3, 240, 320]" in parity["inputs_described"], parity


def test_segment_answers_each_photo_as_the_eager_model(server, eager, photos: list[bytes]):
    for jpeg in photos:
        served, expected = mask_of(server, jpeg), eager(jpeg)
        assert served.shape == expected.shape == Image.open(io.BytesIO(jpeg)).size[::-1]
        assert (served == expected).mean() >= 0.999, "each pixel's class as eager's (near ties aside)"
        summary = httpx.post(f"{server.url}/segment?format=json", files={"image": ("p.jpg", jpeg)}, timeout=60).json()
        indices, counts = np.unique(served, return_counts=True)
        assert {c["index"]: c["share"] for c in summary["classes"]} == pytest.approx(
            dict(zip(indices.tolist(), (counts / served.size).tolist(), strict=True))
        )
        assert (summary["width"], summary["height"]) == Image.open(io.BytesIO(jpeg)).size


def test_the_protocol_answers_each_pixels_class_padded_to_the_largest(server, photos: list[bytes]):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    images = triton.InferInput("image", [len(photos), 1], "BYTES")
    images.set_data_from_numpy(np.array([[jpeg] for jpeg in photos], dtype=object))
    classes = client.infer("handoff", [images]).as_numpy("classes")
    assert classes.shape == (2, 450, 400) and classes.dtype == np.int32
    for i, jpeg in enumerate(photos):
        mask = mask_of(server, jpeg)
        height, width = mask.shape
        assert (classes[i, :height, :width] == mask).all()
        assert (classes[i, height:, :] == -1).all() and (classes[i, :, width:] == -1).all()


def test_a_segmenters_wrong_requests_get_a_4xx_naming_the_problem(server, photos: list[bytes]):
    jpeg = {"content": photos[0], "headers": {"Content-Type": "image/jpeg"}}
    answer = httpx.post(f"{server.url}/detect", **jpeg)
    assert answer.status_code == 404 and "segment" in answer.json()["error"]
    answer = httpx.post(f"{server.url}/segment?format=gif", **jpeg)
    assert answer.status_code == 400 and "png or json" in answer.json()["error"]
    answer = httpx.post(f"{server.url}/classify", **jpeg)
    assert answer.status_code == 404 and "/segment" in answer.json()["error"]


def test_elongated_images_are_refused_and_never_leave_the_segmenter_refusing(server, photos: list[bytes]):
    """Security round 4, items 1 and 5: a 40 KB 26000 x 520 PNG ran the segmenter at 520 x 26000 (70 photos' cost),
    and two or three of them left it answering 503 to everything, for good, while it said ready. Now such an image
    is 413 before the model runs, and a normal photo after them is answered."""
    strip = png_bytes(Image.new("RGB", (26000, 520), (90, 120, 200)))
    answers = [
        httpx.post(f"{server.url}/segment", content=strip, headers={"Content-Type": "image/png"}, timeout=60)
        for _ in range(3)
    ]
    for answer in answers:
        assert answer.status_code == 413 and "photos' worth" in answer.json()["error"], answer.text
    assert mask_of(server, photos[0]).shape == Image.open(io.BytesIO(photos[0])).size[::-1]
    assert httpx.get(f"{server.url}/readyz").status_code == 200


def test_a_protocol_answer_is_bounded_before_the_model_runs(server, photos: list[bytes]):
    """Security round 4, item 2: an 8000 x 1600 and a 1600 x 8000 PNG (96 KB) made a 512 MB answer padded to
    8000 x 8000, built on the event loop: +1.5 GB and /livez stalled ~2 s. Now 413 as soon as the sizes are known,
    /livez within the probe's timeout throughout, and a request of photos still answered."""
    wide, tall = (png_bytes(Image.new("RGB", size, (200, 30, 30))) for size in ((8000, 1600), (1600, 8000)))

    def attack():
        client = triton.InferenceServerClient(server.url.removeprefix("http://"))
        images = triton.InferInput("image", [2], "BYTES")
        images.set_data_from_numpy(np.array([wide, tall], dtype=object))
        try:
            client.infer("handoff", [images])
        except triton.InferenceServerException as err:
            return str(err)
        return "answered"

    slowest, refused = slowest_probe_during(server, attack)
    print(f"\n8000 x 1600 and 1600 x 8000 on the protocol: {refused}; /livez slowest {slowest * 1000:.0f} ms")
    assert "more than the" in refused and "one response may carry" in refused, refused
    assert slowest < probe_timeout_s()
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    images = triton.InferInput("image", [len(photos)], "BYTES")
    images.set_data_from_numpy(np.array(photos, dtype=object))
    assert client.infer("handoff", [images]).as_numpy("classes").shape == (2, 450, 400)
