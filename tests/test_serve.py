"""`bentoml serve` as a real process on localhost, spoken to over real HTTP."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    Server,
    classify,
    digit_images,
    eager_top1,
    missing_cuda_library,
    png_bytes,
    replica_memory_mb,
    run,
)
from docs_snippets import run_curl_lines, run_python_block
from PIL import Image

from contract.manifest import read_manifest_unchecked
from contract.pil_transform import Preprocessor
from contract.preprocessing import Preprocessing
from serve.config import usable_cores
from serve.observability.request_metrics import UNKNOWN
from train.presets import eval_transform

sys.path.insert(0, str(ROOT))  # bench/ is scripts, not an installed package
from bench.app_path import figures_printed  # noqa: E402

pytestmark = pytest.mark.xdist_group("serve")  # its module fixtures stay on one worker


@pytest.fixture(scope="module")
def server(exported: Path, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("logs") / "serve.log", HANDOFF_MODEL_DIR=str(exported))
    srv.ready_seconds = srv.wait_ready()
    yield srv
    srv.stop()


def test_preprocessing_matches_torchvision_exactly():
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(img) for img in load_sample_images().images]
    photos.append(photos[0].crop((10, 0, 310, 427)))  # portrait
    for crop, resize in ((224, 256), (32, 32), (100, 117)):
        spec = {
            "resize": resize,
            "crop": crop,
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
            "interpolation": "bilinear",
            "channels": 3,
        }
        ours = Preprocessor.from_manifest(spec, max_pixels=10**9)
        theirs = eval_transform(Preprocessing(crop=crop, resize=resize))
        for photo in photos:
            np.testing.assert_array_equal(ours(photo), theirs(photo).numpy())


def test_classify_agrees_with_the_eager_model(server, eager):
    images, labels = digit_images(40)
    expected = eager_top1(eager, images)
    served = []
    for image in images:
        response = classify(server.url, png_bytes(image), top_k=3)
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
        assert len(predictions) == 3
        served.append(predictions[0]["index"])
    assert served == expected
    accuracy = np.mean(np.array(served) == np.array(labels))
    assert accuracy > 0.5, f"a trained model should beat chance on digits, got {accuracy:.2f}"


def test_classify_real_photos_is_well_formed(server):
    from sklearn.datasets import load_sample_images

    for photo in load_sample_images().images:
        response = classify(server.url, png_bytes(Image.fromarray(photo), "JPEG", quality=90), name="photo.jpg")
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
        probabilities = [p["probability"] for p in predictions]
        assert len(predictions) == 5 and probabilities == sorted(probabilities, reverse=True)
        assert all(0 <= p <= 1 for p in probabilities) and sum(probabilities) <= 1 + 1e-6
        assert all(p["label"] == str(p["index"]) for p in predictions)


def test_classify_takes_the_image_as_a_raw_body_too(server):
    """`Content-Type: image/jpeg` (or png...) with the image as the body: the multipart form's answer, and the
    same clear 4xx for the same mistakes."""

    def raw(data: bytes, content_type: str = "image/png", query: str = "top_k=3") -> httpx.Response:
        return httpx.post(
            f"{server.url}/classify?{query}", content=data, headers={"content-type": content_type}, timeout=60
        )

    for image in digit_images(3)[0]:
        png = png_bytes(image)
        form, body = classify(server.url, png, top_k=3), raw(png)
        assert body.status_code == 200, body.text
        expected, got = form.json()["predictions"], body.json()["predictions"]
        assert [p["index"] for p in got] == [p["index"] for p in expected]
        assert np.allclose([p["probability"] for p in got], [p["probability"] for p in expected], atol=1e-6)
    jpeg = png_bytes(digit_images(1)[0][0].resize((64, 64)), "JPEG")
    assert raw(jpeg, "image/jpeg").status_code == 200
    for what, response, status, fragment in [
        ("text as image/jpeg", raw(b"just some text\n" * 20, "image/jpeg"), 400, "not an image"),
        ("top_k=0", raw(jpeg, "image/jpeg", "top_k=0"), 400, "top_k"),
        ("top_k of 5,000 digits", raw(jpeg, "image/jpeg", "top_k=" + "9" * 5000), 400, "top_k"),
        ("top_k twice", raw(jpeg, "image/jpeg", "top_k=1&top_k=2"), 400, "once"),
        ("unknown parameter", raw(jpeg, "image/jpeg", "k=1"), 400, "unknown query parameter"),
        ("empty body", raw(b"", "image/png"), 400, "empty"),
        ("TIFF as image/tiff", raw(b"II*\x00", "image/tiff"), 415, "image/jpeg"),
    ]:
        assert response.status_code == status, f"{what}: {response.status_code} {response.text[:300]}"
        assert fragment in response.json()["error"], f"{what}: {response.text[:300]}"
    assert server.status("/readyz") == 200
    assert "Traceback" not in server.log.read_text()


def test_predict_matches_eager_logits(server, eager):
    model, transform = eager
    images, _ = digit_images(5)
    batch = torch.stack([transform(img) for img in images])
    with torch.inference_mode():
        expected = model(batch).numpy()
    response = httpx.post(f"{server.url}/predict", json={"tensor": batch.tolist()}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    np.testing.assert_allclose(np.array(body["logits"]), expected, atol=1e-4, rtol=1e-3)
    np.testing.assert_allclose(np.array(body["probabilities"]).sum(1), 1.0, atol=1e-5)


def test_info_and_probes(server, exported):
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    manifest = read_manifest_unchecked(exported)
    assert info["ready"] and info["runtime"] == "onnx"
    assert info["provider"] == "CPUExecutionProvider" and info["device"] == "cpu"
    # How the model runs on this CPU: timed at load (serve/model/lanes.py), both arrangements at each batch size.
    cpu, cores = info["cpu"], usable_cores()
    assert cpu["workers"] == 1 and cpu["lanes"] * cpu["threads_per_lane"] == cores
    if cores > 1:
        assert cpu["chosen_by"] == "measured"
        assert set(cpu["rows_per_s"]) == {f"1 x {cores} threads", f"{cores} x 1 thread"}
        assert min(min(rates.values()) for rates in cpu["rows_per_s"].values()) > 0
    assert 1 <= info["batching"]["batches_up_to"] <= info["batching"]["max_batch_size"] == 32
    assert info["batching"]["padded_to"] is None  # batches are padded on a GPU only
    # The export measured the fast JPEG decode (top-1 agreement on real images); it passed, so auto uses it.
    assert manifest["decode"]["fast"]["passed"] and manifest["decode"]["fast"]["top1_agreement"] >= 0.995
    assert info["model"]["decode"] == {"setting": "auto", "fast_jpeg": True, "check": manifest["decode"]["fast"]}
    assert info["model"]["sha256"] == manifest["artifacts"]["model.onnx"]["sha256"]
    assert server.status("/livez") == 200 and server.status("/readyz") == 200
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert "bentoml_service_request" in metrics


def bad_requests(url: str) -> list[tuple[str, int, str, httpx.Response]]:
    """(what, expected status, expected message fragment, response) for each hostile or broken input."""
    good = png_bytes(digit_images(1)[0][0])
    jpeg = png_bytes(digit_images(1)[0][0].resize((64, 64)), "JPEG")
    bomb = png_bytes(Image.new("L", (20_000, 20_000)))  # 400 M pixels in a few hundred kB
    tiff = png_bytes(Image.new("RGB", (16, 16)), "TIFF")
    shape = list(np.zeros((1, 3, 32, 32)).shape)
    cases = [
        ("truncated JPEG", 400, "damaged or truncated", classify(url, jpeg[: len(jpeg) // 2], "cut.jpg")),
        ("empty file", 400, "empty", classify(url, b"", "empty.png")),
        ("text named .jpg", 400, "not an image", classify(url, b"just some text\n" * 20, "notes.jpg")),
        ("wrong field name", 400, "image", classify(url, good, field="file")),
        ("decompression bomb", 413, "pixel", classify(url, bomb, "bomb.png")),
        ("TIFF", 415, "unsupported image format", classify(url, tiff, "scan.tiff")),
        ("top_k=0", 400, "top_k", classify(url, good, top_k=0)),
        ("oversized body", 413, "larger than the limit", classify(url, b"\0" * (21 * 1024 * 1024), "big.png")),
        (
            "text/plain body",
            415,
            "multipart/form-data",
            httpx.post(f"{url}/classify", content=b"hello", headers={"content-type": "text/plain"}, timeout=30),
        ),
        (
            "tensor wrong shape",
            400,
            "shape",
            httpx.post(f"{url}/predict", json={"tensor": np.zeros((1, 3, 16, 16)).tolist()}, timeout=30),
        ),
        ("tensor wrong rank", 400, "shape", httpx.post(f"{url}/predict", json={"tensor": [1.0, 2.0]}, timeout=30)),
        ("tensor of strings", 400, "tensor", httpx.post(f"{url}/predict", json={"tensor": [[["a"]]]}, timeout=30)),
        (
            "tensor with NaN",
            400,
            "NaN and Infinity are not JSON numbers",
            httpx.post(
                f"{url}/predict",
                content=json.dumps({"tensor": np.full(shape, np.nan).tolist()}),
                headers={"content-type": "application/json"},
                timeout=30,
            ),
        ),
        (
            "tensor with Inf",
            400,
            "NaN and Infinity are not JSON numbers",
            httpx.post(
                f"{url}/predict",
                content=json.dumps({"tensor": np.full(shape, np.inf).tolist()}),
                headers={"content-type": "application/json"},
                timeout=30,
            ),
        ),
        ("top_k of 5,000 digits", 400, "top_k", classify(url, good, top_k="9" * 5000)),
        (
            "image sent twice, text then file",
            400,
            "once",
            httpx.post(
                f"{url}/classify",
                files=[("image", (None, "hello")), ("image", ("a.png", good, "image/png"))],
                timeout=30,
            ),
        ),
        (
            "an integer past float range",
            400,
            "infinity",
            httpx.post(
                f"{url}/predict",
                content=json.dumps({"tensor": np.zeros(shape).tolist()}).replace("0.0", "1" + "0" * 400, 1),
                headers={"content-type": "application/json"},
                timeout=30,
            ),
        ),
        (
            "1e400 (JSON infinity)",
            400,
            "infinity",
            httpx.post(
                f"{url}/predict",
                content=json.dumps({"tensor": np.zeros(shape).tolist()}).replace("0.0", "1e400", 1),
                headers={"content-type": "application/json"},
                timeout=30,
            ),
        ),
        (
            "predict as form",
            415,
            "application/json",
            httpx.post(f"{url}/predict", files={"tensor": ("t.json", b"[]")}, timeout=30),
        ),
    ]
    return cases


def test_bad_input_gets_a_clear_4xx_and_nothing_breaks(server):
    for what, status, fragment, response in bad_requests(server.url):
        assert response.status_code == status, f"{what}: {response.status_code} {response.text[:300]}"
        body = response.json()
        error = (body[0] if isinstance(body, list) else body)["error"]
        assert fragment.lower() in json.dumps(body).lower(), f"{what}: {error}"
    assert server.status("/readyz") == 200
    assert classify(server.url, png_bytes(digit_images(1)[0][0])).status_code == 200
    log = server.log.read_text()
    assert "Traceback" not in log, "a client's mistake is one INFO line, not a traceback"
    assert "POST /classify: 400" in log and "[ERROR]" not in log


def test_tracing_spans_only_where_tracing_is_configured(server, exported, tmp_path):
    """BentoML's per-request OpenTelemetry span is left out unless an exporter is configured
    (serve/observability/tracing.py): the access log's lines carry trace ids only then."""

    def access_lines(srv: Server) -> list[str]:
        assert classify(srv.url, png_bytes(digit_images(1)[0][0])).status_code == 200
        for _ in range(50):  # the access log is written after the answer
            lines = [line for line in srv.log.read_text().splitlines() if "path=/classify" in line]
            if lines:
                return lines
            time.sleep(0.1)
        raise AssertionError("no access log line for /classify")

    assert not any("trace=" in line for line in access_lines(server))
    traced = {"BENTOML_CONFIG_OPTIONS": "tracing.exporter_type=in_memory tracing.sample_rate=1.0"}
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(exported), **traced) as srv:
        srv.wait_ready()
        assert all("trace=" in line for line in access_lines(srv))


def test_the_docs_show_the_openapi_document_the_service_serves(server, docs_dir):
    """docs/http-api.md includes docs/reference/openapi.json, the document the live service answers (written by
    `make docs-assets`, never by hand): a route or schema changed without it fails here."""
    served = httpx.get(f"{server.url}/docs.json", timeout=10).json()
    assert {"/classify", "/predict"} <= set(served["paths"])
    document = json.dumps(served, indent=2, sort_keys=True) + "\n"
    (docs_dir / "reference" / "openapi.json").write_text(document)
    tracked = (ROOT / "docs" / "reference" / "openapi.json").read_text()
    assert tracked == document, "docs/reference/openapi.json is not what the service serves: run make docs-assets"


def test_the_serve_pages_commands_run_as_written(server, tmp_path):
    """docs/serve.md's curl lines and Python client, run as written against a live service."""
    digit = tmp_path / "digit.png"
    digit.write_bytes(png_bytes(digit_images(1)[0][0]))
    answers = run_curl_lines("serve.md", server.url, {"@digit.png": f"@{digit}"})
    assert sum('"predictions"' in answer for answer in answers) == 3 and "bentoml_service_request" in answers[-1]
    namespace = run_python_block("serve.md", "httpx.post", server.url, {'"digit.png"': repr(str(digit))})
    assert len(namespace["answer"].json()["predictions"]) == 3


def test_info_hides_absolute_paths(server, exported):
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    assert info["model"]["folder"] == exported.name and "/" not in info["model"]["source"]["checkpoint"]


def test_odd_but_valid_images_are_answered(server, eager):
    base = digit_images(1)[0][0].resize((48, 40))
    rgba = base.convert("RGBA")
    rgba.putalpha(128)
    palette = base.convert("P", palette=Image.Palette.ADAPTIVE)
    palette.info["transparency"] = 0
    sixteen = Image.fromarray(np.asarray(base.convert("L"), dtype=np.uint16) * 257)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: must be turned upright before preprocessing
    frames = [base, base.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    animated = io.BytesIO()
    frames[0].save(animated, format="GIF", save_all=True, append_images=frames[1:])
    variants = {
        "grayscale.png": png_bytes(base.convert("L")),
        "rgba.png": png_bytes(rgba),
        "palette.png": png_bytes(palette),
        "cmyk.jpg": png_bytes(base.convert("CMYK"), "JPEG"),
        "16bit.png": png_bytes(sixteen),
        "exif.jpg": png_bytes(base, "JPEG", exif=exif),
        "animated.gif": animated.getvalue(),
        "image.webp": png_bytes(base, "WEBP"),
        "image.bmp": png_bytes(base, "BMP"),
    }
    for name, data in variants.items():
        response = classify(server.url, data, name)
        assert response.status_code == 200, f"{name}: {response.text}"
    # EXIF orientation: the served probabilities are the eager model's on the upright image, not on the raw one.
    from PIL import ImageOps

    model, transform = eager
    raw = Image.open(io.BytesIO(variants["exif.jpg"])).convert("RGB")
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(variants["exif.jpg"]))).convert("RGB")
    assert upright.size == raw.size[::-1]
    with torch.inference_mode():
        probs = {
            k: torch.softmax(model(transform(img)[None]), 1)[0].numpy() for k, img in (("up", upright), ("raw", raw))
        }
    served = classify(server.url, variants["exif.jpg"], "exif.jpg", top_k=10).json()["predictions"]
    served_p = np.array([p["probability"] for p in sorted(served, key=lambda p: p["index"])])
    np.testing.assert_allclose(served_p, probs["up"], atol=1e-4)
    assert np.abs(probs["up"] - probs["raw"]).max() > 1e-3, (
        "the orientation must matter for this check to mean anything"
    )


def test_concurrent_burst_mixing_good_and_bad(server, eager):
    images, _ = digit_images(24)
    expected = eager_top1(eager, images)
    payloads = []
    for i, image in enumerate(images):
        payloads.append(("good", i, png_bytes(image)))
        payloads.append(("bad", i, b"garbage bytes, not an image"))

    def send(item):
        kind, index, data = item
        return kind, index, classify(server.url, data)

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(send, payloads))
    for kind, index, response in results:
        if kind == "good":
            assert response.status_code == 200, response.text
            assert response.json()["predictions"][0]["index"] == expected[index]
        else:
            assert response.status_code == 400
    assert server.status("/readyz") == 200


def _cpu(workers: int, lanes: int, threads: int, chosen_by: str) -> dict:
    """/info's `cpu` where nothing was timed."""
    return {"workers": workers, "lanes": lanes, "threads_per_lane": threads, "chosen_by": chosen_by, "rows_per_s": {}}


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {"HANDOFF_RUNTIME": "torchscript", "HANDOFF_CPU_THREADS": "1"},
            {"runtime": "torchscript", "device": "cpu", "cpu": _cpu(1, 1, 1, "not measured: not ONNX Runtime")},
        ),
        (  # two processes answer on one port, each with its share of the cores
            {"HANDOFF_WORKERS": "2", "HANDOFF_LANES": "1"},
            {"runtime": "onnx", "cpu": _cpu(2, 1, max(1, usable_cores() // 2), "HANDOFF_LANES")},
        ),
        pytest.param(
            {"HANDOFF_DEVICE": "cuda"}, {"provider": "CUDAExecutionProvider", "device": "cuda"}, marks=CUDA_ONLY
        ),
        pytest.param(
            {"HANDOFF_RUNTIME": "torchscript", "HANDOFF_DEVICE": "cuda"},
            {"runtime": "torchscript", "device": "cuda"},
            marks=CUDA_ONLY,
        ),
    ],
)
def test_runtime_and_device_are_used_and_reported(env, expected, exported, tmp_path):
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(exported), **env) as srv:
        srv.wait_ready()
        info = httpx.get(f"{srv.url}/info", timeout=10).json()
        assert {k: info[k] for k in expected} == expected
        image = png_bytes(digit_images(1)[0][0])
        for _ in range(6):  # each on a connection of its own: with two workers, both answer some
            assert classify(srv.url, image).status_code == 200
        assert answered(srv.url, "/classify") == 6, "/metrics counts what every worker answered"


def answered(url: str, path: str) -> float:
    """bentoml_service_request_total for `path`, summed over its statuses (and, in /metrics, over the workers)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = rf'^bentoml_service_request_total{{[^}}]*endpoint="{re.escape(path)}"[^}}]*}} (\S+)$'
    return sum(float(value) for value in re.findall(pattern, text, re.M))


def test_cuda_provider_finds_the_pip_installed_cuda_libraries(exported):
    """Without a GPU the CUDA provider cannot start, but how far it gets shows whether ONNX Runtime found
    the CUDA libraries that pip installed: after preloading, only the driver (libcuda) may be missing."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the provider is tested for real")
    if importlib.util.find_spec("nvidia") is None:
        pytest.skip("no pip-installed CUDA libraries (nvidia-* wheels) in this environment")
    assert missing_cuda_library(Path(sys.executable), exported / "model.onnx", cwd=ROOT).startswith("libcuda.so")


@pytest.fixture(scope="module")
def without_onnx(exported: Path, tmp_path_factory) -> Path:
    """An export of the same checkpoint made with --formats torchscript,safetensors: it lists no model.onnx."""
    out = tmp_path_factory.mktemp("no_onnx") / "export"
    checkpoint = read_manifest_unchecked(exported)["source"]["checkpoint"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            checkpoint,
            "--formats",
            "torchscript,safetensors",
            "--out",
            str(out),
            "--no-bento",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return out


def _faulty_folder(fault: str, exported: Path, without_onnx: Path, tmp_path: Path) -> tuple[Path, dict, str]:
    """(export folder, environment, the words /info must give) for each way a model must not be served."""
    folder = tmp_path / fault
    if fault == "unlisted":  # a foreign model.onnx dropped beside an export that never had one
        shutil.copytree(without_onnx, folder)
        shutil.copy(exported / "model.onnx", folder / "model.onnx")
        return folder, {}, "not listed in the manifest"
    if fault == "cuda-without-gpu":
        return exported, {"HANDOFF_DEVICE": "cuda"}, "HANDOFF_DEVICE=cuda"
    shutil.copytree(exported, folder)
    model = folder / "model.onnx"
    if fault == "tampered":
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0xFF
        model.write_bytes(bytes(data))
        return folder, {}, "does not match the manifest"
    if fault == "missing":
        model.unlink()
        return folder, {}, "model.onnx: missing"
    if fault == "unreadable":
        model.unlink()
        model.mkdir()
        return folder, {}, "model.onnx: not a regular file"
    if fault == "symlink":  # the same bytes, but through a link that could be pointed elsewhere later
        (tmp_path / "elsewhere.onnx").write_bytes(model.read_bytes())
        model.unlink()
        model.symlink_to(tmp_path / "elsewhere.onnx")
        return folder, {}, "symbolic link"
    assert fault == "pinned-sha256"
    return folder, {"HANDOFF_MODEL_SHA256": "0" * 64}, "HANDOFF_MODEL_SHA256"


FAULTS = ["tampered", "missing", "unreadable", "symlink", "unlisted", "pinned-sha256", "cuda-without-gpu"]


def test_not_ready_when_it_must_not_serve(exported, without_onnx, tmp_path):
    """Each fault in its own server, all started at once (they share the wait for start-up)."""
    faults = [f for f in FAULTS if not (f == "cuda-without-gpu" and torch.cuda.is_available())]
    servers = {}
    try:
        for fault in faults:
            (tmp_path / fault).mkdir()
            folder, env, reason = _faulty_folder(fault, exported, without_onnx, tmp_path / fault)
            servers[fault] = (Server(tmp_path / f"{fault}.log", HANDOFF_MODEL_DIR=str(folder), **env), reason)
        image = png_bytes(digit_images(1)[0][0])
        for fault, (srv, reason) in servers.items():
            srv.wait_live()
            assert srv.status("/readyz") == 503, fault
            info = httpx.get(f"{srv.url}/info", timeout=10).json()
            assert info["ready"] is False and reason in info["reason"], (fault, info)
            assert reason in srv.log.read_text(), fault
            assert classify(srv.url, image).status_code == 503, fault
            assert srv.proc.poll() is None, f"{fault}: stays up and says why instead of crash-looping"
    finally:
        for srv, _ in servers.values():
            srv.stop()


def test_api_keys_gate_everything_but_the_probes_and_the_page(exported, tmp_path):
    with Server(
        tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(exported), HANDOFF_API_KEYS="k1-secret, k2-secret"
    ) as srv:
        srv.wait_ready()
        image = png_bytes(digit_images(1)[0][0])
        refused = classify(srv.url, image)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        assert "Authorization: Bearer" in refused.json()["error"]
        wrong = httpx.post(
            f"{srv.url}/classify",
            files={"image": ("a.png", image)},
            headers={"authorization": "Bearer k1-secreT"},
            timeout=30,
        )
        assert wrong.status_code == 401
        for key in ("k1-secret", "k2-secret"):
            ok = httpx.post(
                f"{srv.url}/classify",
                files={"image": ("a.png", image)},
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )
            assert ok.status_code == 200, ok.text
        for path in ("/info", "/metrics", "/docs.json"):
            assert httpx.get(f"{srv.url}{path}", timeout=10).status_code == 401, path
        assert srv.status("/readyz") == 200 and srv.status("/livez") == 200
        page = httpx.get(f"{srv.url}/", timeout=10)
        assert page.status_code == 200 and "API key" in page.text
        assert "k1-secret" not in srv.log.read_text()


def test_the_page_is_sent_with_a_content_security_policy(server):
    page = httpx.get(f"{server.url}/", timeout=10)
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy and "script-src 'sha256-" in policy
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"


def test_stalled_uploads_do_not_lock_the_service(exported, tmp_path):
    """Clients that announce a body and send one byte of it hold no request slot: good requests and GETs are
    answered meanwhile, and each stalled upload gets 408 once the body deadline passes."""
    import socket
    import time

    stalled_count, body_timeout_s = 20, 3
    with Server(
        tmp_path / "serve.log",
        HANDOFF_MODEL_DIR=str(exported),
        HANDOFF_MAX_CONCURRENCY="8",
        HANDOFF_BODY_TIMEOUT_S=str(body_timeout_s),
    ) as srv:
        srv.wait_ready()
        stalled = []
        for _ in range(stalled_count):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(
                b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                b"Content-Length: 100\r\n\r\n-"
            )
            stalled.append(s)
        started = time.monotonic()
        good = classify(srv.url, png_bytes(digit_images(1)[0][0]))
        assert good.status_code == 200, good.text
        assert httpx.get(f"{srv.url}/info", timeout=10).status_code == 200 and srv.status("/readyz") == 200
        assert time.monotonic() - started < body_timeout_s, "answered while the uploads stall, not after they time out"
        answers = []
        for s in stalled:
            answers.append(s.recv(4096).split(b"\r\n", 1)[0])
            s.close()
        assert answers == [b"HTTP/1.1 408 Request Timeout"] * stalled_count, answers[:3]


def test_unknown_paths_do_not_grow_the_metrics(server):
    def series() -> set[str]:
        """The endpoint labels the metrics carry. Not every series: BentoML keeps its Prometheus files in one
        folder per BENTOML_HOME, so another server started meanwhile (a parallel test) adds series of its own."""
        return set(re.findall(r'endpoint="([^"]*)"', httpx.get(f"{server.url}/metrics", timeout=10).text))

    for i in range(3):
        assert httpx.get(f"{server.url}/junk{i}", timeout=10).status_code == 404
    before = series()
    for i in range(100):
        assert httpx.get(f"{server.url}/{str(i) * 3000}", timeout=10).status_code == 404
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    # Labels a parallel test's server may add meanwhile are the service's own routes; none may be a junk path.
    own = {"/", "/info", "/docs.json", "/metrics", "/livez", "/readyz", "/classify", "/predict", "/detect", "/segment"}
    own |= {"/embed", "/rerank", "/v1/embeddings", "/v1/models", "/v1/chat/completions", "/v1/completions"}
    protocol = re.compile(r"/v2(/health/(live|ready)|/models/\w{1,40}(/versions/1)?(/ready|/config|/infer)?)?")
    grown = {label for label in series() - before - own if not protocol.fullmatch(label)}
    assert grown <= {UNKNOWN}, f"new endpoint labels: {sorted(grown)[:10]}"
    assert "0" * 100 not in text and len(text) < 100_000
    assert 'endpoint="/classify"' in text, "known endpoints keep their own series"


def test_grayscale_and_16_bit_uploads_see_the_pixels_torchvision_sees():
    """Grayscale stays one channel until after the resize; 16-bit is scaled (x // 257), not clipped."""
    from sklearn.datasets import load_sample_images

    gray = Image.fromarray(load_sample_images().images[0]).convert("L")
    spec = {
        "resize": 64,
        "crop": 56,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "interpolation": "bicubic",
        "channels": 3,
    }
    ours = Preprocessor.from_manifest(spec, max_pixels=10**9)
    theirs = eval_transform(Preprocessing(crop=56, resize=64, interpolation="bicubic"))
    expected = theirs(gray.convert("RGB")).numpy()
    np.testing.assert_array_equal(ours(ours.decode(png_bytes(gray))), expected)
    sixteen = Image.fromarray(np.asarray(gray, dtype=np.uint16) * 257)
    np.testing.assert_array_equal(ours(ours.decode(png_bytes(sixteen))), expected)


def test_huge_16_bit_uploads_are_decoded_a_few_at_a_time(server):
    """A 90 KB PNG of 6300 x 6300 16-bit pixels: eight at once used to take 3.8 GB (the default thread pool
    decoded them all together, through 32-bit copies); decoding is now one per core, through narrow copies."""
    import threading

    import psutil

    data = png_bytes(Image.fromarray(np.full((6300, 6300), 1000, dtype=np.uint16)))
    worker = psutil.Process(server.proc.pid)

    def rss() -> int:
        return sum(p.memory_info().rss for p in [worker, *worker.children(recursive=True)])

    base, peak, done = rss(), [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            done.wait(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = [r.status_code for r in pool.map(lambda _: classify(server.url, data, "big.png"), range(8))]
    done.set()
    watcher.join()
    growth_mb = (peak[0] - base) / 1e6
    print(f"\n8 concurrent 6300x6300 16-bit PNGs: peak +{growth_mb:.0f} MB")
    assert statuses == [200] * 8
    # Eight legitimate huge uploads at once may take memory, but at most half of what a replica requests (the
    # rest is the model's and the other clients'): past that, the deployment's node would be overcommitted.
    assert growth_mb < replica_memory_mb() / 2, f"peak memory grew by {growth_mb:.0f} MB"


def test_a_request_answered_or_refused_leaves_no_cyclic_garbage(exported: Path):
    """The service lets the garbage collector's youngest generation grow far past Python's default threshold
    (serve/service.py: at c=64 the requests in flight made it collect every ~14 requests), which holds only while a
    request leaves nothing for the collector: every object it makes freed by reference counting, whether it is
    answered or refused. `bench/app_path.py --garbage` sends each kind through the service's connection protocol
    in process, the collector off, and counts what the collector then finds."""
    done = run([sys.executable, str(ROOT / "bench" / "app_path.py"), "--garbage", "--export", str(exported)])
    assert done.returncode == 0, done.stderr[-3000:]
    left = figures_printed(done.stdout)
    kinds = {"answered", "NaN in the tensor", "JSON header broken", "unknown path", "wrong Content-Type"}
    assert set(left) == kinds and all(objects == 0 for objects in left.values()), left
