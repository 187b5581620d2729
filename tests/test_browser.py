"""The page at GET /, in a real headless Chromium driven by Selenium: pick a validation image, read the
top-1 label the page shows, compare it with the eager model's. A screenshot is kept as a test artifact."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import Server, digit_images, eager_top1, png_bytes

from contract.manifest import read_manifest_unchecked

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def ensure_chromium() -> None:
    """Install Debian's chromium and chromium-driver when missing (CI runs as root), else skip saying why."""
    if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.skip(f"could not install chromium ({' '.join(cmd)}): {done.stderr.strip()[-300:]}")


@pytest.fixture(scope="module")
def browser():
    ensure_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Offline machine: keep Chromium from reaching out at start (its connections are refused here).
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1000,800",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_page_classifies_an_uploaded_image_like_the_eager_model(browser, exported, eager, tmp_path, docs_dir):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    image = digit_images(8)[0][7].resize((96, 96))  # a validation digit; the service resizes as in training
    upload = tmp_path / "digit.png"
    upload.write_bytes(png_bytes(image))
    classes = read_manifest_unchecked(exported)["labels"]
    expected = classes[eager_top1(eager, [image])[0]]

    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(exported)) as srv:
        srv.wait_ready()
        browser.get(srv.url + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda d: d.find_element(By.ID, "model").get_attribute("data-ready") == "true")
        model_line = browser.find_element(By.ID, "model").text
        protocol_line = browser.find_element(By.ID, "protocol").text
        browser.find_element(By.ID, "file").send_keys(str(upload))
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in ("done", "error"))
        assert browser.find_element(By.ID, "error").text == ""
        rows = browser.find_elements(By.CSS_SELECTOR, "tr.prediction")
        shown = [row.find_element(By.CLASS_NAME, "label").text for row in rows]
        assert browser.save_screenshot(str(docs_dir / "assets" / "try_page.png"))  # the one the docs show
        wait.until(ready.visibility_of_element_located((By.ID, "preview")))

        # A file that is not an image: the page shows the service's 4xx message instead of predictions.
        junk = tmp_path / "notes.jpg"
        junk.write_bytes(b"just some text, not a picture\n" * 10)
        browser.find_element(By.ID, "file").send_keys(str(junk))
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "error")
        error_shown = browser.find_element(By.ID, "error").text
        assert not browser.find_elements(By.CSS_SELECTOR, "tr.prediction")

    assert "resnet18" in model_line and "onnx" in model_line and "cpu" in model_line, model_line
    assert "POST /v2/models/handoff/infer" in protocol_line, protocol_line
    assert len(shown) == 5
    assert shown[0] == expected, f"page shows {shown}, eager top-1 is {expected}"
    assert "not an image" in error_shown, error_shown


def test_page_classifies_a_sentence_for_a_text_model(browser, text_run, tmp_path):
    """A text classifier's page: a sentence box instead of the image drop; the answer equals the service's."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    sentence = "the meal was awful and I would say so to anyone who asked me about it."
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(text_run / "checkpoint-30.export")) as srv:
        srv.wait_ready()
        expected = httpx.post(f"{srv.url}/classify", json={"text": sentence}, timeout=30).json()["predictions"]
        browser.get(srv.url + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda d: d.find_element(By.ID, "model").get_attribute("data-ready") == "true")
        assert not browser.find_element(By.ID, "drop").is_displayed()
        box = browser.find_element(By.ID, "sentence")
        box.clear()
        box.send_keys(sentence)
        browser.find_element(By.CSS_SELECTOR, "#textbox button").click()
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in ("done", "error"))
        assert browser.find_element(By.ID, "error").text == ""
        shown = [
            row.find_element(By.CLASS_NAME, "label").text
            for row in browser.find_elements(By.CSS_SELECTOR, "tr.prediction")
        ]
        model_line = browser.find_element(By.ID, "model").text
    assert shown == [p["label"] for p in expected]
    assert "DistilBertForSequenceClassification" in model_line, model_line
    assert "a text classifier, 2 classes" in model_line, model_line


def page_with_photo(browser, export: Path, tmp_path: Path, route: str) -> tuple[list[list[str]], dict, dict, str]:
    """The page for `export` given a photo: the rows it lists (label, value), the canvas's size, the service's own
    answer on `route` for the same photo, and the model line."""
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from sklearn.datasets import load_sample_images

    photo = tmp_path / "photo.jpg"
    Image.fromarray(load_sample_images().images[0]).resize((400, 267)).save(photo, format="JPEG", quality=90)
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(export)) as srv:
        srv.wait_ready()
        headers = {"Content-Type": "image/jpeg"}
        expected = httpx.post(f"{srv.url}{route}", content=photo.read_bytes(), headers=headers, timeout=60).json()
        browser.get(srv.url + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda d: d.find_element(By.ID, "model").get_attribute("data-ready") == "true")
        browser.find_element(By.ID, "file").send_keys(str(photo))
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in ("done", "error"))
        assert browser.find_element(By.ID, "error").text == ""
        canvas = browser.find_element(By.ID, "drawing")
        assert canvas.is_displayed()
        size = {k: int(canvas.get_attribute(k)) for k in ("width", "height")}
        rows = [
            [row.find_element(By.CLASS_NAME, "label").text, row.find_element(By.CLASS_NAME, "p").text]
            for row in browser.find_elements(By.CSS_SELECTOR, "tr.prediction")
        ]
        browser.save_screenshot(str(tmp_path / "page.png"))  # a test artifact, outside the tree
        return rows, size, expected, browser.find_element(By.ID, "model").text


def test_page_draws_a_detectors_boxes_over_the_photo(browser, detection_run, tmp_path):
    rows, size, expected, model_line = page_with_photo(
        browser, detection_run / "checkpoint.export", tmp_path, "/detect"
    )
    assert size == {"width": 400, "height": 267}
    shown = expected["detections"][:20]  # the page draws the 20 best
    assert rows == [[d["label"], f"{100 * d['score']:.1f}%"] for d in shown]
    assert "a detector, 3 classes" in model_line, model_line


def test_page_paints_a_mask_rcnns_masks_over_the_photo(browser, instance_run, tmp_path):
    """Each of the 20 best detections' masks decoded by the page's own RLE decoder: as many pixels as pycocotools
    decodes from the same answer."""
    from pycocotools import mask as coco_mask
    from selenium.webdriver.common.by import By

    rows, size, expected, model_line = page_with_photo(
        browser, instance_run / "mask" / "checkpoint.export", tmp_path, "/detect"
    )
    shown = expected["detections"][:20]
    assert rows == [[d["label"], f"{100 * d['score']:.1f}%"] for d in shown]
    assert all(d["mask"]["size"] == [267, 400] for d in shown)
    pixels = sum(int(coco_mask.decode({**d["mask"], "counts": d["mask"]["counts"].encode()}).sum()) for d in shown)
    assert browser.find_element(By.ID, "drawing").get_attribute("data-masks") == f"{len(shown)} masks, {pixels} pixels"


def test_page_paints_a_segmenters_mask_over_the_photo(browser, segmentation_run, tmp_path):
    export = segmentation_run / "checkpoint.export"
    rows, size, summary, model_line = page_with_photo(browser, export, tmp_path, "/segment?format=json")
    assert size == {"width": 400, "height": 267}
    assert rows == [[c["label"], f"{100 * c['share']:.1f}%"] for c in summary["classes"]]
    assert "a segmenter, 3 classes" in model_line, model_line


def page_answer(
    browser, export: Path, upload: Path, tmp_path: Path, **settings: str
) -> tuple[list[list[str]], str, str]:
    """The page for `export` given the file `upload` (its drop zone's input): the rows it lists (label, value), the
    transcript it shows and the drop zone's words."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(export), **settings) as srv:
        srv.wait_ready()
        browser.get(srv.url + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda d: d.find_element(By.ID, "model").get_attribute("data-ready") == "true")
        zone = browser.find_element(By.ID, "droptext").text
        browser.find_element(By.ID, "file").send_keys(str(upload))
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in ("done", "error"))
        assert browser.find_element(By.ID, "error").text == ""
        rows = [
            [row.find_element(By.CLASS_NAME, "label").text, row.find_element(By.CLASS_NAME, "p").text]
            for row in browser.find_elements(By.CSS_SELECTOR, "tr.prediction")
        ]
        return rows, browser.find_element(By.ID, "transcript").text, zone


def test_page_takes_an_audio_file_for_an_audio_classifier_and_a_speech_recognizer(
    browser, audio_run, whisper_run, tmp_path
):
    """The drop zone asks for audio, and shows the classes, or the transcript, the service answers for the file."""
    import numpy as np

    from harness.audio_files import encoded, spoken, tone

    clip = tmp_path / "clip.wav"
    clip.write_bytes(encoded(tone(300, 1.0, 16_000), 16_000, "wav"))
    export = audio_run / "ast" / "checkpoint-30.export"
    rows, _, zone = page_answer(browser, export, clip, tmp_path)
    with Server(tmp_path / "check.log", HANDOFF_MODEL_DIR=str(export)) as srv:
        srv.wait_ready()
        answer = httpx.post(f"{srv.url}/classify", files={"file": ("clip.wav", clip.read_bytes())}, timeout=30)
    assert "audio file" in zone
    assert rows == [[p["label"], f"{100 * p['probability']:.1f}%"] for p in answer.json()["predictions"]]
    words = tmp_path / "words.wav"
    words.write_bytes(encoded(spoken(["two", "four"], np.random.default_rng(3)), 16_000, "wav"))
    export = whisper_run / "checkpoint-60.export"
    rows, transcript, zone = page_answer(browser, export, words, tmp_path)
    with Server(tmp_path / "check.log", HANDOFF_MODEL_DIR=str(export)) as srv:
        srv.wait_ready()
        route = f"{srv.url}/v1/audio/transcriptions"
        text = httpx.post(route, files={"file": ("w.wav", words.read_bytes())}, timeout=60).json()["text"]
    assert "audio file" in zone and rows == [] and transcript == text and text


def test_page_classifies_a_photo_among_labels_for_clip(browser, image_text_run, tmp_path):
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photo = tmp_path / "photo.jpg"
    Image.fromarray(load_sample_images().images[1]).save(photo, format="JPEG", quality=90)
    export = image_text_run / "clip" / "checkpoint-30.export"
    rows, _, zone = page_answer(browser, export, photo, tmp_path)
    labels = "a cat, a dog, a street at night, a bowl of flowers"  # the page's own
    with Server(tmp_path / "check.log", HANDOFF_MODEL_DIR=str(export)) as srv:
        srv.wait_ready()
        form = {"candidate_labels": labels}
        answer = httpx.post(f"{srv.url}/classify", files={"image": ("p.jpg", photo.read_bytes())}, data=form)
    assert "image" in zone
    assert rows == [[p["label"], f"{100 * p['score']:.1f}%"] for p in answer.json()["predictions"]]
