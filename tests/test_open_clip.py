"""open_clip end to end: a tiny open_clip model fine-tuned by open_clip's own trainer under torchrun (2 gloo
processes), its run's checkpoint and its model folder exported with no flags, served, and compared with open_clip
itself (the checkpoint loaded by `create_model_and_transforms(name, pretrained=...)`) on images and texts the export
never saw: `encode_image` on open_clip's transform, `encode_text` on its tokenizer's ids (texts that its cleaning
changes among them), and zero-shot scores as its logits' softmax."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import numpy as np
import open_clip
import pytest
import torch
from conftest import Server
from PIL import Image
from test_image_text import jpeg, unit, unseen_photos

from contract.manifest import read_manifest_unchecked

pytestmark = pytest.mark.xdist_group("open_clip")

CHECKPOINT = "logs/tiny/checkpoints/epoch_2"
# what open_clip's cleaning changes (HTML entities, mojibake, full-width letters, case, whitespace) beside plain text
TEXTS = ["a photo of the digit four", "Caf&eacute; NIGHT\t\tlights", "Ã©tÃ© \uff21\uff22\uff23", "DON'T stop!!!"]
LABELS = ["the digit four", "the digit nine", "a temple"]
ATOL = 1e-4


@pytest.fixture(scope="module")
def library(open_clip_run: Path):
    """The model as open_clip loads the trained checkpoint, its evaluation transform and tokenizer."""
    name = f"local-dir:{open_clip_run / 'tiny'}"
    model, _, transform = open_clip.create_model_and_transforms(name)  # the config alone: weights next
    state = torch.load(open_clip_run / f"{CHECKPOINT}.pt", map_location="cpu", weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    return model.eval(), transform, open_clip.get_tokenizer(name)


@pytest.fixture(scope="module")
def server(open_clip_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("open_clip") / "server.log"
    with Server(log, HANDOFF_MODEL_DIR=str(open_clip_run / f"{CHECKPOINT}.export")) as served:
        served.wait_ready()
        yield served


@pytest.mark.parametrize("export", [f"{CHECKPOINT}.export", "folder.export"])
def test_both_layouts_export_with_open_clips_checks(open_clip_run: Path, export: str):
    manifest = read_manifest_unchecked(open_clip_run / export)
    assert manifest["task"] == "image-text" and manifest["status"] == "passed"
    checks = {c["check"]: c["pass"] for c in manifest["parity"]["image_text"]}
    assert checks == {"encode_image": True, "encode_text": True, "zero-shot logits": True}
    towers = manifest["parity"]["towers"]
    assert [c["check"] for c in towers["text"]["text"]] == ["tokenizer"] and towers["text"]["text"][0]["pass"]
    assert towers["image"]["image"][0]["pass"]  # the service's pixels are open_clip's transform's
    assert manifest["reference"]["library"] == "open_clip_torch"
    assert manifest["tokenizer"]["clean"] == "open_clip" and manifest["tokenizer"]["padding"] == "max_length"
    assert manifest["provenance"]["pass"] and manifest["open_clip"]["model"].startswith("local-dir:")


def test_embeddings_and_zero_shot_are_open_clips(server, library):
    model, transform, tokenizer = library
    with torch.inference_mode():
        theirs_texts = model.encode_text(tokenizer(TEXTS)).numpy()
    features = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS, "normalize": False}, timeout=30).json()
    np.testing.assert_allclose(features, theirs_texts, atol=ATOL * max(1, np.abs(theirs_texts).max()))
    openai = httpx.post(f"{server.url}/v1/embeddings", json={"input": TEXTS}, timeout=30).json()
    np.testing.assert_allclose([d["embedding"] for d in openai["data"]], unit(theirs_texts), atol=ATOL)
    with torch.inference_mode():
        hypotheses = model.encode_text(tokenizer([f"This is a photo of {label}." for label in LABELS]))
    for photo in unseen_photos():
        decoded = Image.open(io.BytesIO(jpeg(photo)))
        with torch.inference_mode():
            image = model.encode_image(transform(decoded)[None])
            logits = model.logit_scale.exp() * unit(image.numpy()) @ unit(hypotheses.numpy()).T
        raw = {"content-type": "image/jpeg"}
        served = httpx.post(f"{server.url}/embed?normalize=false", content=jpeg(photo), headers=raw, timeout=30)
        np.testing.assert_allclose(served.json()[0], image[0].numpy(), atol=ATOL * max(1, float(image.abs().max())))
        fields = {"candidate_labels": ", ".join(LABELS)}
        answer = httpx.post(f"{server.url}/classify", files={"image": ("p.jpg", jpeg(photo))}, data=fields, timeout=30)
        scores = {p["label"]: p["score"] for p in answer.json()["predictions"]}
        theirs = torch.as_tensor(logits).softmax(-1)[0].numpy()
        np.testing.assert_allclose([scores[label] for label in LABELS], theirs, atol=ATOL)
