"""The GPU check's detector and segmenter step: a torchvision Faster R-CNN and an LR-ASPP (random weights from seed
0) exported with parity on the device, served there, their /detect and /segment answers on a real photo against the
eager model on the CPU, then bench/detection_serving.py's figures for each."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.detection_serving import make_model  # noqa: E402
from bench.results import result_path  # noqa: E402
from bench.workload import workload_name  # noqa: E402
from contract.manifest import read_manifest_unchecked  # noqa: E402
from export.detection_parity import Detections, match_detections  # noqa: E402
from harness.server import BentoServer  # noqa: E402

DETECTOR, SEGMENTER = "fasterrcnn_mobilenet_v3_large_320_fpn", "lraspp_mobilenet_v3_large"


def _photo() -> bytes:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    buffer = io.BytesIO()
    Image.fromarray(load_sample_images().images[0]).resize((400, 267)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _eager(folder: Path, arch: str) -> Any:
    """The exported weights in torchvision's own model, on the CPU."""
    import torch
    import torchvision

    model = torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=3)
    model.load_state_dict(torch.load(folder.parent / f"{arch}.pt", weights_only=True))
    return model.eval()


def _pixels(jpeg: bytes) -> Any:
    import torch
    from PIL import Image

    array = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255
    return torch.from_numpy(np.ascontiguousarray(array))


def _detector_agrees(folder: Path, url: str, jpeg: bytes) -> dict[str, Any]:
    import httpx
    import torch

    answer = httpx.post(f"{url}/detect", content=jpeg, headers={"Content-Type": "image/jpeg"}, timeout=120)
    if answer.status_code != 200:
        raise RuntimeError(f"/detect answered {answer.status_code}: {answer.text[:200]}")
    found = answer.json()["detections"]
    served = Detections(
        np.array([d["box"] for d in found], dtype=np.float32).reshape(-1, 4),
        np.array([d["score"] for d in found], dtype=np.float32),
        np.array([d["index"] for d in found], dtype=np.int64),
    )
    with torch.no_grad():
        eager = _eager(folder, DETECTOR)([_pixels(jpeg)])[0]
    reference = Detections(eager["boxes"].numpy(), eager["scores"].numpy(), eager["labels"].numpy())
    settings = read_manifest_unchecked(folder)["detection"]
    matched = match_detections(reference, served, settings["score_threshold"], 100, settings["nms_threshold"])
    if matched.reason is not None:
        raise RuntimeError(f"served detections differ from eager's: {matched.reason}")
    return {
        "detections": len(found),
        "matched": matched.matched,
        "of": matched.of,
        "worst_box_px": matched.worst_box_px,
    }


def _segmenter_agrees(folder: Path, url: str, jpeg: bytes) -> dict[str, Any]:
    import httpx
    import torch
    import torchvision
    from PIL import Image

    answer = httpx.post(f"{url}/segment", content=jpeg, headers={"Content-Type": "image/jpeg"}, timeout=120)
    if answer.status_code != 200:
        raise RuntimeError(f"/segment answered {answer.status_code}: {answer.text[:200]}")
    served = np.asarray(Image.open(io.BytesIO(answer.content)))
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    x = torchvision.transforms.functional.to_tensor(torchvision.transforms.functional.resize(image, 520))
    x = torchvision.transforms.functional.normalize(x, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    with torch.no_grad():
        classes = _eager(folder, SEGMENTER)(x[None])["out"][0].argmax(0).numpy().astype(np.uint8)
    expected = np.asarray(Image.fromarray(classes).resize(image.size, Image.Resampling.NEAREST))
    same = float((served == expected).mean())
    if same < 0.999:
        raise RuntimeError(f"the served mask agrees with eager's on {100 * same:.2f}% of the pixels")
    return {"pixels_equal": same}


def images_on_device(out: Path, device: str, seconds: float, rounds: int, dry_run: bool) -> dict[str, Any]:
    """`dry_run`: each benchmark window --seconds long, not stretched to the queue's drain (a check that it runs)."""
    jpeg = _photo()
    details: dict[str, Any] = {}
    for arch, check in ((DETECTOR, _detector_agrees), (SEGMENTER, _segmenter_agrees)):
        folder = make_model(out, arch, "--device", device)
        parity = read_manifest_unchecked(folder)["parity"]
        if not parity["pass"] or (device == "cuda" and not any(r["device"] == "cuda" for r in parity["results"])):
            raise RuntimeError(f"{arch}: parity did not pass on {device}: {parity['summary']}")
        with BentoServer(out / f"{arch}_serve.log", HANDOFF_MODEL_DIR=str(folder), HANDOFF_DEVICE=device) as server:
            server.wait_ready()
            agreed = check(folder, server.url, jpeg)
        bench = [sys.executable, "-m", "bench", "detection_serving", "--device", device, "--export", str(folder)]
        bench += ["--seconds", str(seconds), "--rounds", str(rounds), "--results-dir", str(out / arch)]
        bench += ["--drains", "0"] if dry_run else []
        done = subprocess.run(bench, cwd=ROOT, capture_output=True, text=True, timeout=900)
        (out / f"{arch}_bench.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"python -m bench detection_serving failed ({done.returncode}): {done.stderr[-500:]}")
        result = json.loads(result_path("detection_serving", device, workload_name(folder), out / arch).read_text())
        details[arch] = {"parity": parity["pass"], **agreed, "ratios": result["ratios"]}
    return details
