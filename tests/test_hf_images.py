"""Hugging Face image classifiers end to end: a ViT trained on the digits by Trainer under torchrun (2 gloo processes),
its image processor saved with the checkpoint, exported with no flags and served on /classify, each answer equal to
transformers' own pipeline (the processor's PIL backend and the model) on images the export never saw. And the other
processors' sizes (a shortest edge and crop_pct, a resize then a crop), each proved against transformers' processor."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import Server, classify, png_bytes, run
from PIL import Image

from contract.manifest import read_manifest_unchecked

pytestmark = pytest.mark.xdist_group("hf_images")

EXPORT = [sys.executable, "-m", "export"]
CHECKPOINT = "checkpoint-300"


def unseen_digits(count: int) -> tuple[list[Image.Image], list[int]]:
    """The last digits of the set, as the fixture draws them, at their own 8 x 8 (the processor resizes them)."""
    from tests.fixtures.hf_image_trainer import digit_photos

    photos, labels = digit_photos()
    return photos[-count:], labels[-count:]


@pytest.fixture(scope="module")
def reference(hf_image_run: Path):
    """transformers' image-classification pipeline on the trained checkpoint, with the processor's PIL backend."""
    checkpoint = hf_image_run / CHECKPOINT
    processor = transformers.AutoImageProcessor.from_pretrained(checkpoint, backend="pil", local_files_only=True)
    model = transformers.AutoModelForImageClassification.from_pretrained(checkpoint, local_files_only=True).eval()
    return transformers.pipeline("image-classification", model=model, image_processor=processor, device="cpu")


@pytest.fixture(scope="module")
def server(hf_image_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("hf_images") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(hf_image_run / f"{CHECKPOINT}.export")) as srv:
        srv.wait_ready()
        yield srv


def test_a_trainer_checkpoint_exports_with_its_processor_and_labels(hf_image_run: Path):
    manifest = read_manifest_unchecked(hf_image_run / f"{CHECKPOINT}.export")
    assert manifest["task"] == "image-classification" and manifest["status"] == "passed", manifest["parity"]
    assert manifest["arch"] == "ViTForImageClassification"
    assert manifest["labels"][:3] == ["zero", "one", "two"]
    pre = manifest["preprocess"]
    assert (pre["resize"], pre["crop"], pre["resize_mode"], pre["interpolation"]) == (32, 32, "exact", "bicubic")
    assert pre["mean"] == pre["std"] == [0.5, 0.5, 0.5]
    provenance = manifest["provenance"]
    assert provenance["pass"] and provenance["matched"] == provenance["model_tensors"] > 0, provenance
    reference = manifest["parity"]["reference"]  # the library is the reference: the pipeline's scores on the photos
    assert reference == [{"check": "transformers pipeline", "pass": True, "reason": None}], reference
    assert manifest["reference"]["call"].startswith("pipeline('image-classification'")
    check = manifest["preprocess_check"]
    assert check["passed"] and check["max_difference_pil"] <= 1e-5, check
    assert check["top1_agreement_torchvision"] == 1.0 and check["max_difference_torchvision"] <= 2, check


def test_classify_answers_as_transformers_pipeline(server, reference):
    images, labels = unseen_digits(24)
    served_top = []
    for image in images:
        answer = classify(server.url, png_bytes(image), top_k=3)
        assert answer.status_code == 200, answer.text
        predictions = answer.json()["predictions"]
        expected = reference(image, top_k=3)
        assert [p["label"] for p in predictions] == [e["label"] for e in expected]
        np.testing.assert_allclose([p["probability"] for p in predictions], [e["score"] for e in expected], atol=1e-4)
        served_top.append(predictions[0]["index"])
    accuracy = float(np.mean(np.array(served_top) == np.array(labels)))
    assert accuracy > 0.2, f"the trained ViT should beat chance (0.1) on digits, got {accuracy:.2f}"


def test_a_photo_in_any_shape_answers_as_the_pipeline(server, reference):
    """A JPEG photo squeezed to the model's square (the processor's exact resize), and a grayscale one."""
    from sklearn.datasets import load_sample_images

    photo = Image.fromarray(load_sample_images().images[1]).resize((301, 227))
    for image in (photo, photo.convert("L")):
        data = png_bytes(image)
        answer = classify(server.url, data, top_k=2)
        assert answer.status_code == 200, answer.text
        expected = reference(image.convert("RGB"), top_k=2)
        served = answer.json()["predictions"]
        assert [p["label"] for p in served] == [e["label"] for e in expected]
        np.testing.assert_allclose([p["probability"] for p in served], [e["score"] for e in expected], atol=1e-4)


def _saved(folder: Path, model, processor) -> Path:
    model.save_pretrained(folder)
    if processor is not None:
        processor.save_pretrained(folder)
    return folder


def test_a_shortest_edge_and_crop_processor_is_proved_and_served_exactly(tmp_path: Path):
    """ConvNeXT's processor (a shortest edge, crop_pct: resized to 45, cropped to 40 with transformers' floor
    offsets) on a save_pretrained folder; the served preprocessing of a photo equals transformers' PIL backend."""
    from contract.pil_transform import Preprocessor

    config = transformers.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3)
    processor = transformers.ConvNextImageProcessor(size={"shortest_edge": 40}, crop_pct=0.875)
    folder = _saved(tmp_path / "convnext", transformers.ConvNextForImageClassification(config), processor)
    done = run([*EXPORT, str(folder), "--formats", "onnx", "--no-bento"])
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest_unchecked(tmp_path / "convnext.export")
    pre = manifest["preprocess"]
    assert (pre["resize"], pre["crop"], pre["resize_mode"], pre["crop_offset"]) == (45, 40, "shorter", "floor")
    assert manifest["preprocess_check"]["passed"] and manifest["status"] == "passed"
    photo = Image.open(__import__("io").BytesIO(png_bytes(Image.new("RGB", (301, 227), (200, 30, 90)))))
    served = Preprocessor.from_manifest(pre, max_pixels=1 << 30)(photo)
    theirs = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")(photo, return_tensors="np")
    np.testing.assert_allclose(served, theirs["pixel_values"][0], atol=1e-5)


def test_processors_the_contract_cannot_describe_are_refused_in_one_line(tmp_path: Path):
    from export.image_processor import preprocessing_of

    config = transformers.ViTConfig(
        image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    model = transformers.ViTForImageClassification(config)
    cases = {  # the first two through the command line, the others as its translation raises them
        "no processor": (None, "no preprocessor_config.json"),
        "non-square": (transformers.ViTImageProcessor(size={"height": 16, "width": 24}), "non-square size"),
        "rescale": (transformers.ViTImageProcessor(size={"height": 16, "width": 16}, rescale_factor=1 / 127), "1/255"),
        "lanczos": (transformers.ViTImageProcessor(size={"height": 16, "width": 16}, resample=1), "PIL filter 1"),
        "padding": (transformers.ViTImageProcessor(size={"height": 16, "width": 16}, do_pad=True), "do_pad"),
    }
    for name, (processor, words) in list(cases.items())[:2]:
        folder = _saved(tmp_path / name.replace(" ", "_"), model, processor)
        done = run([*EXPORT, str(folder), "--formats", "onnx", "--no-bento"])
        assert done.returncode != 0 and words in done.stderr, (name, done.stderr[-1500:])
        assert len(done.stderr.strip().splitlines()) == 1, (name, done.stderr)
        assert not (tmp_path / f"{folder.name}.export").exists(), name
    for name, (processor, words) in list(cases.items())[2:]:
        folder = _saved(tmp_path / name, model, processor)
        with pytest.raises(ValueError, match=words):
            preprocessing_of(transformers.AutoImageProcessor.from_pretrained(folder, backend="pil"))


def test_a_wrong_crop_offset_fails_the_processor_check():
    """The check would catch the service cropping as torchvision does (rounded offsets) where the processor floors."""
    import dataclasses

    from export.image_processor import check_processor, preprocessing_of

    processor = transformers.ConvNextImageProcessor(size={"shortest_edge": 40}, crop_pct=0.875)
    folder = Path(__import__("tempfile").mkdtemp())
    processor.save_pretrained(folder)
    right = preprocessing_of(processor)
    wrong = dataclasses.replace(right, crop_offset="round")
    photos = [Image.new("RGB", (640, 427), (10, 200, 40)).rotate(17, fillcolor=(250, 250, 0))]
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 40 * 40, 3))
    assert check_processor(folder, model, right.to_manifest(), photos, False).passed
    assert not check_processor(folder, model, wrong.to_manifest(), photos, False).passed


def test_a_multi_label_classifier_is_scored_as_its_pipeline_scores_it(hf_image_run: Path, tmp_path: Path):
    """`problem_type: multi_label_classification`: the pipeline gives each label's sigmoid, and so does /classify."""
    folder = tmp_path / CHECKPOINT
    shutil.copytree(hf_image_run / CHECKPOINT, folder, ignore=shutil.ignore_patterns("optimizer.pt", "rng_*"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"problem_type": "multi_label_classification"}))
    done = run([*EXPORT, str(folder), "--no-bento", "--formats", "onnx"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_manifest_unchecked(tmp_path / f"{CHECKPOINT}.export")["scores"] == "sigmoid"
    processor = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil", local_files_only=True)
    model = transformers.AutoModelForImageClassification.from_pretrained(folder, local_files_only=True).eval()
    pipeline = transformers.pipeline("image-classification", model=model, image_processor=processor, device="cpu")
    image = unseen_digits(1)[0][0]
    expected = pipeline(image, top_k=3)
    assert sum(e["score"] for e in pipeline(image, top_k=None)) > 1.05  # independent labels: no softmax
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(tmp_path / f"{CHECKPOINT}.export")) as srv:
        srv.wait_ready()
        served = classify(srv.url, png_bytes(image), top_k=3).json()["predictions"]
    assert [p["label"] for p in served] == [e["label"] for e in expected]
    np.testing.assert_allclose([p["probability"] for p in served], [e["score"] for e in expected], atol=1e-4)
