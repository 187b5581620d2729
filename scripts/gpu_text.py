"""The GPU check's Hugging Face step: a DistilBERT sequence classifier (bench/text_serving.py's, built from a config)
exported with parity on the device, served there, its answers over /classify and the protocol (BYTES texts)
against the eager transformers model on the same tokenizer, then bench/text_serving.py's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.load import Upload  # noqa: E402
from bench.results import result_path  # noqa: E402
from bench.text_serving import make_model, make_texts, requests_for  # noqa: E402
from bench.workload import workload_name  # noqa: E402
from contract.manifest import read_manifest_unchecked  # noqa: E402
from harness.server import BentoServer  # noqa: E402

TOLERANCE = 1e-3  # on probabilities: fp32 with TF32 off on CUDA, as the image steps


def eager_probabilities(trained: Path, texts: list[str]) -> list[list[float]]:
    """What the user's own model answers: transformers on the CPU, each text alone (no padding)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(trained)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(trained).eval()
    with torch.inference_mode():
        return [
            model(**tokenizer(text, return_tensors="pt", truncation=True)).logits.softmax(-1)[0].tolist()
            for text in texts
        ]


def _post(url: str, upload: Upload) -> dict[str, Any]:
    import httpx

    answer = httpx.post(f"{url}{upload.path}", content=upload.body, headers=upload.headers, timeout=60)
    if answer.status_code != 200:
        raise RuntimeError(f"{upload.path} answered {answer.status_code}: {answer.text[:200]}")
    return answer.json()


def text_on_device(out: Path, device: str, seconds: float, rounds: int, sides: list[str]) -> dict[str, Any]:
    folder = make_model(out, "--device", device)
    parity = read_manifest_unchecked(folder)["parity"]
    if not parity["pass"]:
        raise RuntimeError(f"the export's parity failed: {parity['summary']}")
    if device == "cuda" and not any(r["device"] == "cuda" for r in parity["results"]):
        raise RuntimeError("no artifact was compared on CUDA")
    texts = make_texts(8)
    expected = eager_probabilities(out / "distilbert", texts)
    with BentoServer(out / "text_hf_serve.log", HANDOFF_MODEL_DIR=str(folder), HANDOFF_DEVICE=device) as server:
        server.wait_ready()
        served = []
        for upload in requests_for("ours", texts):
            by_index = {p["index"]: p["probability"] for p in _post(server.url, upload)["predictions"]}
            served.append([by_index[i] for i in range(len(by_index))])
        # all texts in one protocol request, as JSON (tritonclient's BYTES [N] in its JSON form)
        inputs = [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]
        infer = Upload(
            "/v2/models/handoff/infer", {"Content-Type": "application/json"}, json.dumps({"inputs": inputs}).encode()
        )
        protocol = _post(server.url, infer)
    gaps = [abs(a - b) for row, eager in zip(served, expected, strict=True) for a, b in zip(row, eager, strict=True)]
    probabilities = next(o for o in protocol["outputs"] if o["name"] == "probabilities")["data"]
    flat = [value for row in expected for value in row]
    gaps += [abs(a - b) for a, b in zip(probabilities, flat, strict=True)]
    if max(gaps) > TOLERANCE:
        raise RuntimeError(f"served probabilities differ from the eager model's by {max(gaps):.2e}")
    bench = [sys.executable, "-m", "bench", "text_serving", "--device", device, "--export", str(folder)]
    bench += ["--seconds", str(seconds), "--rounds", str(rounds), "--sides", *sides, "--results-dir", str(out)]
    done = subprocess.run(bench, cwd=ROOT, capture_output=True, text=True, timeout=900)
    (out / "text_bench.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"python -m bench text_serving failed ({done.returncode}): {done.stderr[-500:]}")
    result = json.loads(result_path("text_serving", device, workload_name(folder), out).read_text())
    return {
        "parity": {r["artifact"]: r["passed"] for r in parity["results"]},
        "text_checks": {c["check"]: c["pass"] for c in parity["text"]},
        "max_abs_difference": max(gaps),
        "ratios": result["ratios"],
        "ours": {
            c: {k: result["services"]["ours"][c][k] for k in ("images_per_s", "p50_ms", "errors")} for c in ("1", "64")
        },
    }
