"""handoff against llama.cpp's server on the same fine-tuned model, side by side, at the same precision class.

    python -m bench llama_cpp_peer [--seconds 8] [--rounds 3] [--tokens 64]

Model: generation_serving's Llama (hidden 256, 4 layers, its byte-level BPE and ChatML) fine-tuned here on the Zen of
Python for a few steps (so that its choices are the model's, not noise), saved with `save_pretrained`, then:
- handoff: `python -m export` (fp32) and `python -m export --int4` (int4, past its accuracy gate), each served by
  `bentoml serve`;
- llama.cpp: the export's hf/ folder converted by llama.cpp's own converter (convert_hf_to_gguf.py from
  llama-cpp-python's source distribution, its pre-tokenizer named, bench/peer/llama_cpp_convert.py) to f32, and
  quantized to Q4_0 by llama.cpp's `llama_model_quantize` (blocks of 32, as handoff's int4), each served by
  llama-cpp-python's server (n_threads = the cores), in a virtualenv of its own (bench/.peers/llama_cpp:
  llama-cpp-python is compiled from source the first time, minutes). Its repacked CPU kernels are off
  (bench/peer/llama_cpp_server.py: on this model's Q4_0 its AMX path crashed the process), which may cost it speed.
llama.cpp's ids for the prompts are checked equal to handoff's first. Both sides answer POST /v1/completions with
`stream: true`, every request generating exactly --tokens tokens (`min_tokens` = `max_tokens`, greedy), at
concurrency 1 and 8: generated tokens/s over all requests after the first second, and the time to the first token
(p50). llama-cpp-python's server runs one generation at a time (its `llama-server` binary, whose --parallel decodes
several in one batch, is not built by the Python package); at c=8 the others wait (`--interrupt_requests False`: by
default a new request cuts the running one off).
Goal (issue 76): handoff >= 1.0 x llama.cpp's tokens/s at c=8 and >= 0.8 x at c=1, each precision.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.generation_serving import WARM_S, make_prompts, over, print_round, write_comparison  # noqa: E402
from bench.peer.venvs import PEERS, peer_python  # noqa: E402
from bench.results import median_of_rounds, side_order  # noqa: E402
from bench.text_serving import zen_words  # noqa: E402
from contract.generation import HF_FOLDER, TOKENIZER, GenerationSettings, PromptTokenizer  # noqa: E402
from contract.manifest import read_artifact, read_manifest  # noqa: E402
from harness.server import BentoServer  # noqa: E402
from serve.config import usable_cores  # noqa: E402

LLAMA_CPP = "llama-cpp-python==0.3.36"
PEER_PACKAGES = ("llama-cpp-python[server]==0.3.36",)
CONCURRENCY = (1, 8)
PRECISIONS = ("fp32", "int4")
GGUF_TYPES = {"fp32": "f32", "int4": "q4_0"}
GOAL = "handoff >= 1.0 x llama.cpp's tokens/s at c=8 and >= 0.8 x at c=1, each precision"
PRE_TOKENIZER = "gpt-2"  # the benchmark tokenizer's word split: tokenizers' ByteLevel regex, GPT-2's


def fine_tuned(work: Path, steps: int = 60) -> Path:
    """generation_serving's Llama, fine-tuned on the Zen of Python by a plain loop, saved with save_pretrained."""
    import torch

    from bench.generation_serving import make_model

    make_model(work)  # its save_pretrained folder (work/llama), and an export not used here
    import transformers

    folder = work / "llama"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(" ".join(zen_words() * 4))["input_ids"]
    windows = torch.tensor([ids[i : i + 64] for i in range(0, len(ids) - 64, 16)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(steps):
        batch = windows[torch.randint(len(windows), (8,))]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"fine-tuned {steps} steps on the Zen of Python: loss {loss.item():.3f}")
    tuned = work / "tuned"
    model.eval().save_pretrained(tuned)
    tokenizer.save_pretrained(tuned)
    model.generation_config.save_pretrained(tuned)
    return tuned


def export(folder: Path, out: Path, *flags: str) -> Path:
    command = [sys.executable, "-m", "export", str(folder), "--out", str(out), "--no-bento", "--new-tokens", "16"]
    done = subprocess.run([*command, *flags], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"python -m export {folder} {' '.join(flags)} failed:\n{done.stdout[-1500:]}")
    return out


def llama_cpp_source() -> Path:
    """llama.cpp as llama-cpp-python's source distribution vendors it (its converter and gguf-py)."""
    folder = PEERS / "llama_cpp_source"
    source = folder / LLAMA_CPP.replace("-", "_").replace("==", "-") / "vendor" / "llama.cpp"
    if not source.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", LLAMA_CPP, "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*command, "-d", str(folder)], check=True, capture_output=True, timeout=600)
        with tarfile.open(next(folder.glob("*.tar.gz"))) as archive:
            archive.extractall(folder, filter="data")
    return source


def converted(export_folder: Path, work: Path) -> dict[str, Path]:
    """The export's hf/ folder as llama.cpp's f32 GGUF (its converter) and Q4_0 (its quantizer)."""
    extra = PEERS / "llama_cpp_converter"  # the converter's one need this environment lacks, apart from it
    if not (extra / "sentencepiece").is_dir():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(extra), "sentencepiece"]
        subprocess.run(pip, check=True, timeout=600)
    f32, q4 = work / "model.f32.gguf", work / "model.q4_0.gguf"
    converter = [sys.executable, str(ROOT / "bench/peer/llama_cpp_convert.py"), str(llama_cpp_source()), PRE_TOKENIZER]
    converter += ["--", str(export_folder / HF_FOLDER), "--outfile", str(f32), "--outtype", "f32"]
    env = {**os.environ, "PYTHONPATH": str(extra)}
    subprocess.run(converter, check=True, capture_output=True, timeout=600, env=env)
    quantize = [str(peer_python("llama_cpp", PEER_PACKAGES)), str(ROOT / "bench/peer/llama_cpp_model.py")]
    subprocess.run([*quantize, "quantize", str(f32), str(q4)], check=True, capture_output=True, timeout=600)
    return {"fp32": f32, "int4": q4}


def same_ids(export_folder: Path, gguf: Path, prompts: list[str], work: Path) -> None:
    """llama.cpp's ids for `prompts` against handoff's served tokenizer's: the two must generate from the same."""
    manifest = read_manifest(export_folder)
    ours = PromptTokenizer(
        read_artifact(export_folder, manifest, TOKENIZER), GenerationSettings.from_manifest(manifest["generation"])
    )
    (work / "prompts.json").write_text(json.dumps(prompts))
    python = peer_python("llama_cpp", PEER_PACKAGES)
    command = [
        str(python),
        str(ROOT / "bench/peer/llama_cpp_model.py"),
        "tokenize",
        str(gguf),
        str(work / "prompts.json"),
    ]
    theirs = json.loads(subprocess.run(command, check=True, capture_output=True, text=True, timeout=300).stdout)
    for prompt, ids in zip(prompts, theirs, strict=True):
        if ours.encode_prompt(prompt) != ids:
            raise RuntimeError(
                f"llama.cpp tokenizes {prompt[:40]!r} as {ids[:12]}, handoff as {ours.encode_prompt(prompt)[:12]}"
            )


class LlamaCppServer(BentoServer):
    """llama-cpp-python's OpenAI-compatible server on a GGUF, stopped as a BentoServer is."""

    ready_path = "/v1/models"

    def __init__(self, log: Path, gguf: Path) -> None:
        python = peer_python("llama_cpp", PEER_PACKAGES)
        threads = str(usable_cores())
        command = [str(python), str(ROOT / "bench/peer/llama_cpp_server.py"), "--model", str(gguf), "--n_ctx", "2048"]
        command += ["--n_threads", threads, "--n_threads_batch", threads, "--interrupt_requests", "False"]
        command += ["--host", "127.0.0.1", "--port"]
        self._start(log, command, ROOT, {})


async def load(url: str, prompts: list[str], concurrency: int, tokens: int, seconds: float) -> dict[str, Any]:
    """Streamed completions of exactly `tokens` tokens from `concurrency` clients for `seconds`: tokens/s after
    the first second (each answer's tokens: its usage where the server gives it, else its chunks), first token p50."""
    import httpx

    done: list[tuple[float, int]] = []
    firsts: list[float] = []
    started = time.perf_counter()

    async def client(k: int, http: httpx.AsyncClient) -> None:
        i = k
        while time.perf_counter() < started + seconds:
            body = {"prompt": prompts[i % len(prompts)], "max_tokens": tokens, "min_tokens": tokens, "temperature": 0}
            body |= {"stream": True, "stream_options": {"include_usage": True}}
            sent, first, chunks, used = time.perf_counter(), 0.0, 0, 0
            async with http.stream("POST", url + "/v1/completions", json=body) as answer:
                async for line in answer.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        used = int(event["usage"]["completion_tokens"])
                    if event.get("choices") and event["choices"][0].get("text"):
                        first = first or time.perf_counter() - sent
                        chunks += 1
            firsts.append(first)
            done.append((time.perf_counter(), used or chunks))
            i += concurrency

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=concurrency)) as http:
        await asyncio.gather(*(client(k, http) for k in range(concurrency)))
    steady = [(t, n) for t, n in done if t - started >= WARM_S]
    span = max(t for t, _ in steady) - started - WARM_S if steady else 0.0
    return {
        "tokens_per_s": sum(n for _, n in steady) / span if span > 0 else 0.0,
        "requests": len(done),
        "first_token_p50_ms": statistics.median(firsts) * 1000 if firsts else None,
    }


def measure(server: BentoServer, prompts: list[str], args: Any) -> dict[str, Any]:
    server.wait_ready(600)
    asyncio.run(load(server.url, prompts, 1, 4, 1.0))  # warm
    return {str(c): asyncio.run(load(server.url, prompts, c, args.tokens, args.seconds)) for c in CONCURRENCY}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=8.0, help="load per concurrency level, side and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64, help="tokens generated by every request")
    p.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default: bench/results)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llama-cpp-bench-"))
    tuned = fine_tuned(work)
    exports = {"fp32": export(tuned, work / "fp32.export"), "int4": export(tuned, work / "int4.export", "--int4")}
    ggufs = converted(exports["fp32"], work)
    prompts = make_prompts()
    same_ids(exports["fp32"], ggufs["fp32"], prompts, work)
    rounds = []
    for round_ in range(args.rounds):
        figures: dict[str, Any] = {}
        for precision in PRECISIONS:
            for side in side_order(["handoff", "llama_cpp"], round_):
                log = work / f"{side}-{precision}-{round_}.log"
                server = (
                    BentoServer(log, HANDOFF_MODEL_DIR=str(exports[precision]))
                    if side == "handoff"
                    else LlamaCppServer(log, ggufs[precision])
                )
                with server:
                    figures[f"{side}_{precision}"] = measure(server, prompts, args)
        rounds.append(figures)
        print_round(round_, figures)
    median = median_of_rounds(rounds)
    ratios: dict[str, float] = {}
    for precision in PRECISIONS:
        name = f"handoff_over_llama_cpp_{precision}"
        ratios |= over(median, f"handoff_{precision}", f"llama_cpp_{precision}", CONCURRENCY, name)
    met = all(
        ratios[f"handoff_over_llama_cpp_{p}_c8"] >= 1.0 and ratios[f"handoff_over_llama_cpp_{p}_c1"] >= 0.8
        for p in PRECISIONS
    )
    peer = f"{LLAMA_CPP} (its server, f32 and Q4_0 GGUF)"
    write_comparison("llama_cpp_peer", "", args, (median, rounds, ratios), GOAL, met, peer=peer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
