"""The Bento is what gets deployed: export, `bentoml build`, then serve the built Bento from a fresh
virtualenv made only from the Bento's own requirements, outside this checkout, as a GPU host would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import yaml
from conftest import (
    ROOT,
    Server,
    classify,
    deployment_container,
    digit_images,
    eager_top1,
    kubernetes_documents,
    missing_cuda_library,
    png_bytes,
)

from contract.manifest import read_manifest_unchecked
from contract.pil_transform import Preprocessor
from serve.config import SETTINGS

pytestmark = pytest.mark.xdist_group("bento")  # its module fixtures stay on one worker

PROBES = {"/readyz", "/livez"}  # BentoML's own probes


def build_bento(env: dict[str, str]) -> str:
    """`bentoml build` from the checkout in `env` (its BENTOML_HOME); the Bento's tag."""
    built = subprocess.run(
        [str(Path(sys.executable).parent / "bentoml"), "build", "--output", "tag"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return built.stdout.strip().splitlines()[-1].removeprefix("__tag__:")


@pytest.fixture(scope="module")
def bento(exported: Path, tmp_path_factory) -> dict:
    """A model exported into a fresh BentoML home, built into a Bento, and a virtualenv made only from the
    Bento's requirements."""
    work = tmp_path_factory.mktemp("bento")
    env = {**os.environ, "BENTOML_HOME": str(work / "home")}
    checkpoint = read_manifest_unchecked(exported)["source"]["checkpoint"]
    out = work / "export"
    done = subprocess.run(
        [sys.executable, "-m", "export", checkpoint, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    tag = build_bento(env)
    name, version = tag.split(":")
    path = work / "home" / "bentos" / name / version
    model_tag = done.stdout.strip().split("BentoML model ")[-1]
    assert model_tag.split(":")[1] in (path / "bento.yaml").read_text(), "the model is packed into the Bento"
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        # --no-compile: Python compiles what it imports when it imports it; compiling every module up front is
        # a third of an install from pip's cache (kserve's: 48 -> 33 s), for a server that imports few of them.
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--no-compile",
            "-r",
            str(path / "env/python/requirements.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=work,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return {"tag": tag, "path": path, "venv": venv, "home": work / "home", "export": out, "cwd": work}


def serve_bento(bento: dict, log: Path, **env: str) -> Server:
    """`bentoml serve TAG` run outside the checkout by the fresh environment: only what the Bento carries."""
    assert "PYTHONPATH" not in os.environ, "the checkout must not leak into the Bento's environment"
    return Server(
        log,
        target=bento["tag"],
        cwd=bento["cwd"],
        bentoml=bento["venv"] / "bin" / "bentoml",
        BENTOML_HOME=str(bento["home"]),
        PATH=f"{bento['venv'] / 'bin'}:{os.environ['PATH']}",
        **env,
    )


def test_the_built_bento_serves_from_a_torch_free_environment(bento, eager, tmp_path):
    python = bento["venv"] / "bin" / "python"
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, cwd=bento["cwd"])
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    requirements = (bento["path"] / "env" / "python" / "requirements.txt").read_text()
    assert "\ntorch==" not in requirements and "onnxruntime-gpu==" in requirements

    images, _ = digit_images(20)
    manifest = read_manifest_unchecked(bento["export"])
    preprocess = Preprocessor.from_manifest(manifest["preprocess"], max_pixels=10**8)
    session = ort.InferenceSession(str(bento["export"] / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": np.stack([preprocess(img) for img in images])})[0]
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)

    with serve_bento(bento, tmp_path / "bento.log") as srv:
        srv.wait_ready()
        served_top1, served_p = [], []
        for image in images:
            response = classify(srv.url, png_bytes(image), top_k=1)
            assert response.status_code == 200, response.text
            served_top1.append(response.json()["predictions"][0]["index"])
            served_p.append(response.json()["predictions"][0]["probability"])
        assert served_top1 == eager_top1(eager, images) == expected.argmax(1).tolist()
        np.testing.assert_allclose(served_p, expected.max(1), atol=1e-5)
        info = httpx.get(f"{srv.url}/info", timeout=10).json()
        assert info["model"]["sha256"] == manifest["artifacts"]["model.onnx"]["sha256"]
        for path in probe_paths(kubernetes_documents()):
            assert srv.status(path) == 200, path
        # The protocol, as KServe's readiness probe and a client reach it in the Bento (deploy/kserve.yaml).
        assert srv.status("/v2/models/handoff/ready") == 200
        files = [png_bytes(image) for image in images[:4]]
        binary = b"".join(len(f).to_bytes(4, "little") + f for f in files)
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "image",
                        "datatype": "BYTES",
                        "shape": [4],
                        "parameters": {"binary_data_size": len(binary)},
                    }
                ]
            }
        ).encode()
        answer = httpx.post(
            f"{srv.url}/v2/models/handoff/infer",
            content=header + binary,
            headers={"inference-header-content-length": str(len(header))},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        logits = next(o for o in answer.json()["outputs"] if o["name"] == "logits")
        assert np.argmax(np.reshape(logits["data"], (4, -1)), 1).tolist() == served_top1[:4]


def test_the_bento_carries_every_library_the_cuda_provider_opens(bento):
    """Without a GPU the provider cannot start; in the Bento's environment it must get as far as the driver."""
    missing = missing_cuda_library(
        bento["venv"] / "bin" / "python", bento["export"] / "model.onnx", cwd=bento["path"] / "src"
    )
    assert missing == "libcuda.so.1", f"the Bento lacks {missing}: only the host's driver may be missing"


def test_torchscript_without_torch_is_not_ready_and_says_why(bento, tmp_path):
    with serve_bento(bento, tmp_path / "ts.log", HANDOFF_RUNTIME="torchscript") as srv:
        srv.wait_live()
        assert srv.status("/readyz") == 503
        info = httpx.get(f"{srv.url}/info", timeout=10).json()
        assert info["ready"] is False and "needs torch" in info["reason"]
        assert srv.proc.poll() is None, "stays up instead of crash-looping"


def probe_paths(documents: list[dict]) -> set[str]:
    container = deployment_container(documents)
    return {container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe", "startupProbe")}


def test_the_kubernetes_manifest_matches_the_service(bento):
    documents = kubernetes_documents()
    container = deployment_container(documents)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probe_paths(documents) <= PROBES
    dockerfile = (bento["path"] / "env" / "docker" / "Dockerfile").read_text()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"EXPOSE {ports['http']}" in dockerfile, "the container port is the one the Bento's image serves on"
    assert "ENV NVIDIA_DRIVER_CAPABILITIES=" in dockerfile, "the NVIDIA container toolkit mounts the driver"
    # `bentoml serve` posts usage statistics to BentoML's servers unless told not to: bentofile.yaml's envs tell
    # the image (as a build argument's default)
    assert "ARG BENTOML_DO_NOT_TRACK=true" in dockerfile, "the image sends BentoML no usage statistics"
    assert "FROM python:" in dockerfile and "torch" not in dockerfile
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ("http", ports["http"])
    names = {e["name"] for e in container["env"]}
    assert names <= set(SETTINGS), f"unknown settings {names - set(SETTINGS)}"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    service = next(d for d in documents if d["kind"] == "Service")
    assert service["spec"]["selector"] == documents[0]["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] in ("http", ports["http"])


def test_the_kserve_manifest_matches_the_service(bento):
    """deploy/kserve.yaml: the port the Bento's image serves on, a readiness probe on the protocol's model
    readiness for the name it sets, only settings the service reads, one GPU, the autoscaler's bounds."""
    from serve.http.endpoint import open_paths
    from serve.http.routes import route_table
    from serve.protocols.oip import ProtocolSurface

    (service,) = yaml.safe_load_all((ROOT / "deploy" / "kserve.yaml").read_text())
    assert service["kind"] == "InferenceService" and service["apiVersion"].startswith("serving.kserve.io/")
    predictor = service["spec"]["predictor"]
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"
    dockerfile = (bento["path"] / "env" / "docker" / "Dockerfile").read_text()
    (port,) = container["ports"]
    assert f"EXPOSE {port['containerPort']}" in dockerfile
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env.pop("PROTOCOL") == "v2"
    assert set(env) <= set(SETTINGS), f"unknown settings {set(env) - set(SETTINGS)}"
    probe = container["readinessProbe"]["httpGet"]
    assert probe["port"] == port["containerPort"]
    name = env["HANDOFF_MODEL_NAME"]
    table = route_table(ProtocolSurface(name, "1", lambda: None), dict, "handoff", "1", name)
    assert probe["path"] in open_paths(table.common, name) and probe["path"].endswith("/ready")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_a_bento_built_from_a_text_export_answers_a_text(bento, text_run, tmp_path):
    """The Trainer's checkpoint exported into the store under its own name and built into a Bento: the Bento's
    environment (the tokenizers library, no torch, no transformers) tokenizes and answers a text as the export's
    own ONNX model does on the export's tokenizer."""
    from contract.tokenizer_spec import TextTokenizer, TokenizerSettings

    env = {**os.environ, "BENTOML_HOME": str(bento["home"]), "HANDOFF_MODEL_NAME": "handoff-text"}
    out = tmp_path / "text.export"
    command = [sys.executable, "-m", "export", str(text_run / "checkpoint-30"), "--out", str(out), "--name"]
    done = subprocess.run([*command, "handoff-text"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    tag = build_bento(env)
    path = bento["home"] / "bentos" / tag.replace(":", "/")
    requirements = (path / "env/python/requirements.txt").read_text()
    # the same packages as the image Bento's (an unpinned dependency may resolve to a release published between the
    # two builds, as idna did once in a CI run)
    assert _packages(requirements) == _packages((bento["path"] / "env/python/requirements.txt").read_text())
    assert "tokenizers==" in requirements and "\ntransformers==" not in requirements
    python = bento["venv"] / "bin" / "python"
    for absent in ("torch", "transformers"):
        probe = subprocess.run([str(python), "-c", f"import {absent}"], capture_output=True, cwd=bento["cwd"])
        assert probe.returncode != 0, f"{absent} is in the Bento's environment"

    manifest = read_manifest_unchecked(out)
    tokenizer = TextTokenizer(
        (out / "tokenizer.json").read_bytes(), TokenizerSettings.from_manifest(manifest["tokenizer"])
    )
    text = "the film was superb."
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(None, tokenizer.encode([text]).rows)[0][0]
    with serve_bento({**bento, "tag": tag}, tmp_path / "bento.log", HANDOFF_MODEL_NAME="handoff-text") as srv:
        srv.wait_ready()
        answer = httpx.post(f"{srv.url}/classify", json={"text": text, "top_k": 2}, timeout=30)
    assert answer.status_code == 200, answer.text
    expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    best = answer.json()["predictions"][0]
    assert best["index"] == int(expected.argmax()) and abs(best["probability"] - expected.max()) < 1e-4


def _packages(requirements: str) -> list[str]:
    """The names a requirements file pins, without their versions."""
    return sorted(line.split("==")[0].strip().lower() for line in requirements.splitlines() if "==" in line)


def test_a_bento_built_from_a_language_model_answers_a_chat(bento, language_run, tmp_path):
    """The Trainer's checkpoint of a language model exported into the store (its folders too) and built into a
    Bento: the Bento's environment (no torch, no transformers) answers a chat as transformers' greedy generate."""
    import torch
    import transformers

    env = {**os.environ, "BENTOML_HOME": str(bento["home"]), "HANDOFF_MODEL_NAME": "handoff-llm"}
    command = [sys.executable, "-m", "export", str(language_run / "checkpoint-40"), "--out", str(tmp_path / "llm")]
    done = subprocess.run([*command, "--name", "handoff-llm"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    tag = build_bento(env)
    chat = [{"role": "user", "content": "What comes after five?"}]
    model = transformers.AutoModelForCausalLM.from_pretrained(language_run / "checkpoint-40").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(language_run / "checkpoint-40")
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)
    expected = tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)
    with serve_bento({**bento, "tag": tag}, tmp_path / "bento.log", HANDOFF_MODEL_NAME="handoff-llm") as srv:
        srv.wait_ready()
        body = {"messages": chat, "temperature": 0, "max_tokens": 20}
        answer = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == expected
