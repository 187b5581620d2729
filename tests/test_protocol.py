"""The Open Inference Protocol against a real `bentoml serve`, spoken by the real clients: tritonclient's
sync client (binary by default, and JSON), its aio client at concurrency 32, and raw hostile bodies."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from conftest import Server, digit_images, png_bytes
from docs_snippets import run_curl_lines, run_python_block
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.xdist_group("protocol")

NAME = "digits"  # HANDOFF_MODEL_NAME, also with HANDOFF_MODEL_DIR


@pytest.fixture(scope="module")
def server(exported: Path, tmp_path_factory):
    srv = Server(
        tmp_path_factory.mktemp("protocol") / "serve.log",
        HANDOFF_MODEL_DIR=str(exported),
        HANDOFF_MODEL_NAME=NAME,
        HANDOFF_MAX_BATCH_SIZE="8",
        HANDOFF_MAX_CONCURRENCY="32",
        HANDOFF_DECODE="exact",  # today's bit-exact decoding, whatever the export's check said
    )
    srv.wait_ready()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    with triton.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def images():
    pictures, _ = digit_images(24)
    return pictures, [png_bytes(p) for p in pictures]


def eager_logits(eager, pictures) -> np.ndarray:
    model, transform = eager
    with torch.inference_mode():
        return model(torch.stack([transform(p) for p in pictures])).numpy()


def image_input(files: list[bytes], binary: bool = True) -> triton.InferInput:
    data = np.array([[f] for f in files], dtype=object)
    tensor = triton.InferInput("image", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


def test_exact_decoding_is_kept_when_asked(server):
    decode = httpx.get(f"{server.url}/info", timeout=10).json()["model"]["decode"]
    assert decode["setting"] == "exact" and decode["fast_jpeg"] is False and decode["check"]["passed"]


def test_the_protocol_pages_examples_run_as_written(server, images, tmp_path):
    """docs/protocol.md's tritonclient example and its curl lines, run as written (the model renamed)."""
    digit = tmp_path / "digit.png"
    digit.write_bytes(images[1][0])
    namespace = run_python_block(
        "protocol.md", "tritonclient", server.url, {'"handoff"': repr(NAME), '"digit.png"': repr(str(digit))}
    )
    assert namespace["top3"].name() == "probabilities"
    answers = run_curl_lines("protocol.md", server.url, {"/models/handoff/": f"/models/{NAME}/"})
    assert [json.loads(answer) for answer in answers] == [{"ready": True}]  # the one complete line: model ready


def test_health_metadata_and_config_as_tritonclient_reads_them(client):
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(NAME)
    assert client.is_model_ready(NAME, "1") and not client.is_model_ready("other")
    server = client.get_server_metadata()
    assert server["extensions"] == ["binary_tensor_data", "classification", "model_configuration"]
    metadata = client.get_model_metadata(NAME)
    assert metadata["versions"] == ["1"] and metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]},
        {"name": "image", "datatype": "BYTES", "shape": [-1, 1]},
    ]
    assert [o["name"] for o in metadata["outputs"]] == ["logits", "probabilities"]
    config = client.get_model_config(NAME)
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [3, 32, 32]
    assert config["input"][1]["data_type"] == "TYPE_STRING" and config["output"][0]["dims"] == [10]
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("other")
    assert err.value.status() == "404" and "unknown model 'other'" in err.value.message()


def test_images_and_tensors_binary_and_json_equal_the_eager_model(client, eager, images):
    pictures, files = images
    expected = eager_logits(eager, pictures[:6])
    for binary in (True, False):  # the sync client's default (binary), then JSON both ways
        outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("logits", "probabilities")]
        result = client.infer(NAME, [image_input(files[:6], binary=True)], outputs=outputs, request_id="r-1")
        np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(result.as_numpy("probabilities").sum(1), 1, atol=1e-5)
        assert result.get_response()["id"] == "r-1"
        _, transform = eager
        tensor = torch.stack([transform(p) for p in pictures[:6]]).numpy()
        floats = triton.InferInput("input", list(tensor.shape), "FP32")
        floats.set_data_from_numpy(tensor, binary_data=binary)
        result = client.infer(NAME, [floats], outputs=outputs)
        np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=1e-4, rtol=1e-4)
    default = client.infer(NAME, [image_input(files[:2])])  # no outputs named: every output, binary
    assert default.get_output("logits")["parameters"]["binary_data_size"] == 2 * 10 * 4


def test_classification_extension_answers_top_k_labels(client, eager, images):
    pictures, files = images
    result = client.infer(
        NAME, [image_input(files[:3])], outputs=[triton.InferRequestedOutput("probabilities", class_count=3)]
    )
    top = result.as_numpy("probabilities")
    assert top.shape == (3, 3)
    expected = eager_logits(eager, pictures[:3]).argmax(1)
    for row, best in zip(top, expected):
        score, index, label = row[0].decode().split(":")
        assert int(index) == best and label == str(best) and 0 < float(score) <= 1


def test_the_aio_client_at_concurrency_32(server, eager, images):
    pictures, files = images
    expected = eager_logits(eager, pictures)

    async def run() -> list[np.ndarray]:
        async with triton_aio.InferenceServerClient(f"127.0.0.1:{server.port}", conn_limit=32) as aio:

            async def one(i: int) -> np.ndarray:
                result = await aio.infer(NAME, [image_input([files[i % len(files)]])])
                return result.as_numpy("logits")[0]

            return await asyncio.gather(*(one(i) for i in range(96)))

    answers = asyncio.run(run())
    for i, logits in enumerate(answers):
        np.testing.assert_allclose(logits, expected[i % len(files)], atol=1e-4, rtol=1e-4)


def raw_infer(url: str, document: dict, binary: bytes = b"", header: str | None = None) -> httpx.Response:
    body = json.dumps(document).encode()
    headers = {}
    if binary or header is not None:
        headers["inference-header-content-length"] = header if header is not None else str(len(body))
    return httpx.post(f"{url}/v2/models/{NAME}/infer", content=body + binary, headers=headers, timeout=30)


def test_hostile_bodies_get_400_and_the_server_stays_well(server, images):
    png = images[1][0]

    def fp32(shape, size):
        return {
            "inputs": [{"name": "input", "datatype": "FP32", "shape": shape, "parameters": {"binary_data_size": size}}]
        }

    one_image = struct.pack("<I", len(png)) + png
    cases = [
        (
            "header length past the body",
            raw_infer(server.url, fp32([1, 3, 32, 32], 12288), b"\0" * 12288, "999999"),
            "outside",
        ),
        (
            "negative header length",
            raw_infer(server.url, fp32([1, 3, 32, 32], 12288), b"\0" * 12288, "-1"),
            "whole number",
        ),
        ("binary size against the shape", raw_infer(server.url, fp32([1, 3, 32, 32], 100), b"\0" * 100), "disagrees"),
        # refused by its shape alone, before the size of its data is compared
        ("10^9 rows, a small body", raw_infer(server.url, fp32([10**9, 3, 32, 32], 100), b"\0" * 100), "rows; send 1"),
        ("a claim the body cannot hold", raw_infer(server.url, fp32([2, 3, 32, 32], 100), b"\0" * 100), "disagrees"),
        (
            "a BYTES length past its tensor",
            raw_infer(
                server.url,
                {
                    "inputs": [
                        {"name": "image", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 20}}
                    ]
                },
                struct.pack("<I", 10**6) + b"x" * 16,
            ),
            "runs past its tensor",
        ),
        (
            "a datatype the model does not take",
            raw_infer(
                server.url,
                {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1, 3, 32, 32], "data": [0] * 3072}]},
            ),
            "not INT64",
        ),
        (
            "more rows than HANDOFF_MAX_BATCH_SIZE",
            raw_infer(
                server.url,
                {
                    "inputs": [
                        {
                            "name": "image",
                            "datatype": "BYTES",
                            "shape": [9, 1],
                            "parameters": {"binary_data_size": 9 * len(one_image)},
                        }
                    ]
                },
                one_image * 9,
            ),
            "send 1 to 8",
        ),
        (
            "data of the wrong length",
            raw_infer(
                server.url,
                {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3071}]},
            ),
            "3072 elements",
        ),
        (
            "NaN",
            httpx.post(
                f"{server.url}/v2/models/{NAME}/infer",
                content=b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1], "data": [NaN]}]}',
            ),
            "not valid JSON",
        ),
        (
            "not an image",
            raw_infer(
                server.url, {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}
            ),
            "image[0]: not an image",
        ),
        (
            "an unknown output",
            raw_infer(
                server.url,
                {
                    "inputs": [
                        {
                            "name": "image",
                            "datatype": "BYTES",
                            "shape": [1],
                            "parameters": {"binary_data_size": len(one_image)},
                        }
                    ],
                    "outputs": [{"name": "boxes"}],
                },
                one_image,
            ),
            "unknown output",
        ),
    ]
    for what, response, words in cases:
        assert response.status_code == 400, f"{what}: {response.status_code} {response.text[:300]}"
        assert words in response.json()["error"], f"{what}: {response.text[:300]}"
    fp64 = raw_infer(
        server.url, {"inputs": [{"name": "input", "datatype": "FP64", "shape": [1, 3, 32, 32], "data": [0.5] * 3072}]}
    )
    assert fp64.status_code == 200, fp64.text  # FP64 for FP32 is converted
    assert httpx.post(f"{server.url}/v2/models/other/infer", content=b"{}").status_code == 404
    log = server.log.read_text()
    assert "Traceback" not in log and f"POST /v2/models/{NAME}/infer: 400" in log
    assert httpx.get(f"{server.url}/v2/health/ready").json() == {"ready": True}


def test_health_answers_under_load_never_429(server, images):
    """128 infers sent at once, each on its own connection, against HANDOFF_MAX_CONCURRENCY=32, so that the limit
    is reached (some get 429): the probes sent while they are answered get 200 every time."""
    files = images[1]

    def infer_request(i: int) -> bytes:
        image = struct.pack("<I", len(files[i % 24])) + files[i % 24]
        size = {"binary_data_size": len(image)}
        document = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "parameters": size}]})
        body = document.encode() + image
        head = (
            f"POST /v2/models/{NAME}/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Inference-Header-Content-Length: {len(document)}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    # Whole requests written on open connections before any answer is read: a client pool of threads never
    # had more than 32 in the server at once on 2 cores, so it never reached the limit it was meant to test.
    load = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _ in range(128)]
    for i, connection in enumerate(load):
        connection.sendall(infer_request(i))
    probes = [
        httpx.get(f"{server.url}{p}", timeout=10).status_code
        for p in ["/v2/health/ready", f"/v2/models/{NAME}/ready"] * 10
    ]
    statuses, retry_afters = set(), set()
    for connection in load:
        with connection:
            head = connection.recv(4096).split(b"\r\n\r\n", 1)[0].lower()
            statuses.add(status := int(head.split(b" ", 2)[1]))
            if status == 429:  # when to come back, as HTTP asks of a refusal that passes with time
                retry_afters.add(next((line for line in head.split(b"\r\n") if line.startswith(b"retry-after:")), None))
    assert probes == [200] * 20 and statuses <= {200, 429}, statuses
    assert 429 in statuses, "the load never reached the limit, so the probes were not sent under it"
    assert retry_afters == {b"retry-after: 1"}, retry_afters


@pytest.fixture(scope="module")
def kserve_python(tmp_path_factory) -> Path:
    """A virtualenv with PyPI's `kserve` (about 35 s; --no-compile, as for the Bento's in test_bento.py): installed
    beside the project's own, kserve's dependencies (its FastAPI, its own pins) would change the environment of the
    server under test."""
    venv = tmp_path_factory.mktemp("kserve") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", "kserve>=0.15,<1"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv / "bin" / "python"


def test_kserves_own_rest_client_speaks_to_it(server, eager, images, kserve_python, tmp_path):
    pictures, _ = images
    _, transform = eager
    tensor = torch.stack([transform(p) for p in pictures[:3]]).numpy()
    np.save(tmp_path / "tensor.npy", tensor)
    script = Path(__file__).parent / "clients" / "kserve_client.py"
    ran = subprocess.run(
        [str(kserve_python), str(script), server.url, NAME, str(tmp_path / "tensor.npy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout)
    assert found["live"] and found["ready"] and found["model_ready"]
    expected = eager_logits(eager, pictures[:3])
    for binary in (False, True):
        answer = found[f"binary={binary}"]
        assert answer["id"] == f"kserve-{binary}"
        np.testing.assert_allclose(answer["outputs"]["logits"], expected, atol=1e-4, rtol=1e-4)
