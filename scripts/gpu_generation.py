"""The GPU check's step for a language model (issue 58): a small Llama (random weights, bench/generation_serving.py)
exported on the device (on CUDA the GenAI model is fp16, onnxruntime-genai-cuda), its parity passed there, served
there with a greedy chat answer compared with transformers' on the same device, and measured by
bench/generation_serving.py (tokens/s and time to the first token, c=1 and c=16, against the in-process loop).
Where vLLM is installed (a GPU host; not in the CPU dry run), `vllm serve` is started on the export's consolidated
folder (`hf/`) and its greedy answer to the same chat compared with handoff's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import generation_serving  # noqa: E402
from bench.results import result_path  # noqa: E402
from bench.workload import workload_name  # noqa: E402
from contract.generation import HF_FOLDER  # noqa: E402
from contract.manifest import read_manifest_unchecked  # noqa: E402
from harness.server import BentoServer, ScriptServer  # noqa: E402

CHAT = [{"role": "user", "content": "Beautiful is better than"}]
TOKENS = 24


def _greedy_reference(folder: Path, device: str) -> str:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder / HF_FOLDER).eval()
    model.to(torch.device(device))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder / HF_FOLDER)
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids], device=device), max_new_tokens=TOKENS, do_sample=False)
    return str(tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True))


def _chat(url: str, model: str | None = None) -> str:
    body: dict[str, Any] = {"messages": CHAT, "temperature": 0, "max_tokens": TOKENS}
    if model is not None:
        body["model"] = model
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    answer.raise_for_status()
    return str(answer.json()["choices"][0]["message"]["content"])


def _vllm(folder: Path, log: Path) -> dict[str, Any]:
    """vLLM's greedy answer on the consolidated folder (None where vLLM is not installed)."""
    if importlib.util.find_spec("vllm") is None:
        return {"vllm": "not installed"}
    spec = importlib.util.find_spec("vllm.entrypoints.openai.api_server")
    assert spec is not None and spec.origin is not None
    arguments = ("--model", str(folder / HF_FOLDER), "--host", "127.0.0.1", "--port")
    with VllmServer(log, Path(spec.origin), *arguments) as server:
        server.wait_ready(timeout=600)
        return {"vllm": _chat(server.url, str(folder / HF_FOLDER))}


class VllmServer(ScriptServer):
    ready_path = "/health"


def generation_on_device(out: Path, device: str, seconds: float, rounds: int) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    folder = generation_serving.make_model(out, "--device", device)
    manifest = read_manifest_unchecked(folder)
    parity = manifest["parity"]
    if manifest["status"] != "passed" or not parity["device"].startswith(device):
        raise RuntimeError(f"the language model's parity did not pass on {device}: {parity['summary']}")
    details: dict[str, Any] = {"genai": manifest["genai"], "parity": parity["generation"]}
    with BentoServer(out / "serve.log", HANDOFF_MODEL_DIR=str(folder), HANDOFF_DEVICE=device) as server:
        server.wait_ready()
        details["served_device"] = httpx.get(server.url + "/info").json()["device"]
        details["handoff"] = _chat(server.url)
    details["transformers"] = _greedy_reference(folder, device)
    details["handoff_equals_transformers"] = details["handoff"] == details["transformers"]
    details |= _vllm(folder, out / "vllm.log")
    command = [sys.executable, "-m", "bench", "generation_serving", "--device", device, "--export", str(folder)]
    command += ["--seconds", str(seconds), "--rounds", str(rounds), "--results-dir", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    (out / "generation_serving.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"python -m bench generation_serving failed ({done.returncode}): {done.stderr[-500:]}")
    result = json.loads(result_path("generation_serving", device, workload_name(folder), out).read_text())
    return details | {"ratios": result["ratios"]}
