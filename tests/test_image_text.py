"""CLIP and SigLIP end to end: a tiny CLIP fine-tuned by Trainer and a tiny SigLIP by a plain DDP loop under torchrun
(2 gloo processes), exported (Trainer's checkpoint-N with no flags; rank 0's DDP state_dict with --hf-config), served,
and compared with the library on images and texts the export never saw: `get_image_features` / `get_text_features`
for /embed and /v1/embeddings, `pipeline("zero-shot-image-classification")` for /classify, its hypothesis template
included."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
import tritonclient.http as triton
from conftest import Server, assert_serves_only_its_routes
from PIL import Image, ImageOps
from sklearn.datasets import load_digits, load_sample_images

from contract.manifest import read_manifest_unchecked

pytestmark = pytest.mark.xdist_group("image_text")

MODELS = {"clip": "clip/checkpoint-30", "siglip": "siglip/ddp_state"}
TEXTS = ["a photo of the digit four", "a bowl of flowers", "night"]
LABELS = ["the digit four", "the digit nine", "a temple"]
ATOL = 1e-4


def unseen_photos() -> list[Image.Image]:
    """A sample photo turned and cropped, and a digit as the fixture draws them but in another tint and size."""
    temple = ImageOps.mirror(Image.fromarray(load_sample_images().images[0]).crop((40, 30, 600, 400)))
    digit = load_digits().images[1500] / 16.0
    drawn = (255 * (1 - np.kron(digit, np.ones((6, 6)))[..., None] * np.array([0.2, 0.6, 0.9]))).astype(np.uint8)
    return [temple, Image.fromarray(drawn)]


def jpeg(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def libraries(image_text_run: Path):
    """Each model as its user loads it: CLIP from Trainer's folder, SigLIP from its base config and rank 0's
    state_dict (the `module.` prefix removed), with their processors."""
    clip_folder = image_text_run / "clip/checkpoint-30"
    base = image_text_run / "siglip/base"
    siglip = transformers.SiglipModel(transformers.SiglipConfig.from_pretrained(base))
    state = torch.load(image_text_run / "siglip/ddp_state.pt", map_location="cpu", weights_only=True)
    siglip.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    found = {}
    for name, model, folder in (
        ("clip", transformers.CLIPModel.from_pretrained(clip_folder), clip_folder),
        ("siglip", siglip, base),
    ):
        processor = transformers.AutoProcessor.from_pretrained(folder)
        images = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")
        pipe = transformers.pipeline(
            "zero-shot-image-classification",
            model=model.eval(),
            tokenizer=processor.tokenizer,
            image_processor=images,
            device="cpu",
        )
        found[name] = (model, processor.tokenizer, images, pipe)
    return found


@pytest.fixture(scope="module")
def servers(image_text_run: Path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("image_text")
    with (
        Server(folder / "clip.log", HANDOFF_MODEL_DIR=str(image_text_run / "clip/checkpoint-30.export")) as clip,
        Server(folder / "siglip.log", HANDOFF_MODEL_DIR=str(image_text_run / "siglip/ddp_state.export")) as siglip,
    ):
        clip.wait_ready()
        siglip.wait_ready()
        yield {"clip": clip, "siglip": siglip}


def library_vectors(library, texts: list[str] | None = None, photos: list[Image.Image] | None = None) -> np.ndarray:
    model, tokenizer, images, _ = library
    with torch.inference_mode():
        if texts is not None:
            siglip = model.config.model_type == "siglip"
            padding = {"padding": "max_length", "max_length": 64} if siglip else {"padding": True}
            answer = model.get_text_features(**tokenizer(texts, truncation=True, return_tensors="pt", **padding))
        else:
            answer = model.get_image_features(**images([p.convert("RGB") for p in photos], return_tensors="pt"))
    return (answer if isinstance(answer, torch.Tensor) else answer.pooler_output).numpy()


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("name", MODELS)
def test_the_exports_pass_with_the_librarys_checks(image_text_run: Path, name: str):
    manifest = read_manifest_unchecked(image_text_run / f"{MODELS[name]}.export")
    assert manifest["task"] == "image-text" and manifest["status"] == "passed"
    checks = {c["check"]: c["pass"] for c in manifest["parity"]["image_text"]}
    assert checks == {"get_image_features": True, "get_text_features": True, "zero-shot pipeline": True}
    assert {"image/manifest.json", "text/manifest.json", "tokenizer.json"} <= set(manifest["artifacts"])
    for tower in ("image", "text"):
        assert read_manifest_unchecked(image_text_run / f"{MODELS[name]}.export" / tower)["status"] == "passed"
    assert manifest["image_text"]["scores"] == ("sigmoid" if name == "siglip" else "softmax")
    assert manifest["tokenizer"]["padding"] == ("max_length" if name == "siglip" else "longest")
    assert manifest["provenance"]["pass"]


@pytest.mark.parametrize("name", MODELS)
def test_embeddings_are_the_librarys_features(servers, libraries, name):
    url, library = servers[name].url, libraries[name]
    theirs = library_vectors(library, texts=TEXTS)
    unit_vectors = httpx.post(f"{url}/embed", json={"inputs": TEXTS}, timeout=30).json()
    features = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "normalize": False}, timeout=30).json()
    openai = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS}, timeout=30).json()
    np.testing.assert_allclose(features, theirs, atol=ATOL * max(1, np.abs(theirs).max()))
    np.testing.assert_allclose(unit_vectors, unit(theirs), atol=ATOL)
    np.testing.assert_allclose([d["embedding"] for d in openai["data"]], unit(theirs), atol=ATOL)
    photos = unseen_photos()
    theirs_images = library_vectors(library, photos=photos)
    for photo, expected in zip(photos, theirs_images, strict=True):
        raw = httpx.post(f"{url}/embed?normalize=false", content=jpeg(photo), headers={"content-type": "image/jpeg"})
        form = httpx.post(f"{url}/embed", files={"image": ("p.jpg", jpeg(photo), "image/jpeg")}, timeout=30)
        assert raw.status_code == 200 and form.status_code == 200, (raw.text, form.text)
        # the JPEG's decoded pixels, compared with the library on the very same pixels
        decoded = library_vectors(library, photos=[Image.open(io.BytesIO(jpeg(photo)))])[0]
        np.testing.assert_allclose(raw.json()[0], decoded, atol=ATOL * max(1, np.abs(decoded).max()))
        np.testing.assert_allclose(form.json()[0], unit(decoded[None])[0], atol=ATOL)
        assert np.dot(unit(decoded[None])[0], unit(expected[None])[0]) > 0.99  # JPEG costs little


@pytest.mark.parametrize("name", MODELS)
def test_zero_shot_is_the_pipelines(servers, libraries, name):
    url, pipe = servers[name].url, libraries[name][3]
    for photo in unseen_photos():
        data = Image.open(io.BytesIO(jpeg(photo)))
        for template in (None, "a picture showing {}"):
            options = {} if template is None else {"hypothesis_template": template}
            theirs = pipe(data.convert("RGB"), candidate_labels=LABELS, **options)
            fields = {"candidate_labels": ", ".join(LABELS), **options}
            answer = httpx.post(f"{url}/classify", files={"image": ("p.jpg", jpeg(photo))}, data=fields, timeout=30)
            assert answer.status_code == 200, answer.text
            ours = answer.json()["predictions"]
            assert [p["label"] for p in ours] == [t["label"] for t in theirs]
            np.testing.assert_allclose([p["score"] for p in ours], [t["score"] for t in theirs], atol=ATOL)


def test_the_protocol_embeds_texts_and_images(servers, libraries):
    url, library = servers["clip"].url, libraries["clip"]
    with triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=60) as client:
        text = triton.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
        by_text = client.infer("handoff", [text]).as_numpy("embeddings")
        photo = jpeg(unseen_photos()[1])
        image = triton.InferInput("image", [1, 1], "BYTES")
        image.set_data_from_numpy(np.array([[photo]], dtype=object))
        by_image = client.infer("handoff", [image]).as_numpy("embeddings")
    np.testing.assert_allclose(by_text, library_vectors(library, texts=TEXTS), atol=1e-3)
    served = httpx.post(f"{url}/embed?normalize=false", content=photo, headers={"content-type": "image/jpeg"}).json()
    np.testing.assert_allclose(by_image, served, atol=1e-5)


@pytest.mark.parametrize(
    ("fields", "status", "words"),
    [
        ({}, 400, "send candidate_labels"),
        ({"candidate_labels": "a, b", "hypothesis_template": "no slot"}, 400, 'must hold "{}"'),
        ({"candidate_labels": ",".join(str(i) for i in range(101))}, 400, "at most 100"),
    ],
)
def test_a_zero_shot_request_it_cannot_answer_is_refused_in_one_line(servers, fields, status, words):
    url = servers["clip"].url
    answer = httpx.post(f"{url}/classify", files={"image": ("p.jpg", jpeg(unseen_photos()[1]))}, data=fields)
    assert answer.status_code == status and words in answer.json()["error"], answer.text


def test_only_its_routes_are_served_and_the_page_asks_for_labels(servers):
    url = servers["siglip"].url
    assert_serves_only_its_routes(url, {"POST /embed", "POST /v1/embeddings", "POST /classify"})
    routes = {r["path"]: r for r in httpx.get(f"{url}/info", timeout=10).json()["routes"]}
    assert "candidate_labels" in routes["/classify"]["fields"]  # the page shows its labels box for it
    text = httpx.post(f"{url}/classify", json={"image": "x"}, timeout=10)
    assert text.status_code == 415 and "takes an image" in text.json()["error"]
