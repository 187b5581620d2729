"""A language model's two artifacts: the consolidated Hugging Face folder (`hf/`: the weights as loaded, in the
checkpoint's dtype, with config, generation config, tokenizer and chat template; the folder a user keeps and vLLM
serves on a GPU host) and the ONNX Runtime GenAI model built from that very folder (`genai/`: the decoder with its
KV cache, fp32 on the CPU, fp16 for CUDA), by the builder onnxruntime-genai ships.

The builder runs as its own process: it prints freely, and a crash inside it must not take the export with it.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from contract.generation import GENAI_FOLDER, GENAI_INT4_FOLDER, HF_FOLDER
from export.tensor_model import first_line

log = logging.getLogger("export")
BUILDER = "onnxruntime_genai.models.builder"
BUILD_TIMEOUT_S = 3600
# What the builder builds as a text model (its own table, onnxruntime-genai 0.18), as handoff's parity proves each
GENAI_ARCHITECTURES = (
    "Ernie4_5ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "GemmaForCausalLM",
    "GraniteForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "NemotronForCausalLM",
    "OlmoForCausalLM",
    "Phi3ForCausalLM",
    "PhiForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "SmolLM3ForCausalLM",
)


def checkpoint_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype most of the checkpoint's floating-point tensors have (what the consolidated folder keeps)."""
    counts: dict[torch.dtype, int] = {}
    for tensor in state.values():
        if tensor.is_floating_point():
            counts[tensor.dtype] = counts.get(tensor.dtype, 0) + tensor.numel()
    return max(counts, key=lambda d: counts[d]) if counts else torch.float32


def write_hf_folder(model: Any, tokenizer: Any, generation_config: Any, dtype: torch.dtype, out: Path) -> list[str]:
    """The consolidated folder: safetensors in `dtype`, the config, the generation config and the tokenizer with its
    chat template; the files written, relative to `out`'s parent."""
    folder = out / HF_FOLDER
    model.to(dtype).save_pretrained(folder, safe_serialization=True)
    model.float()
    generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sorted(str(p.relative_to(out)) for p in folder.rglob("*") if p.is_file())


# Sliding-window layers (Gemma 2's, Mistral's) with caches of the full length, the window applied by the attention's
# mask: the builder's bounded caches make the runtime refuse any generation shorter than the window ("KV cache capacity
# (41) must be at least local_window_size (4096)"), which every request of a few tokens is.
EXTRA_OPTIONS = ("windowed_kv_cache=false",)
# int4's weights in blocks of 32 (the builder's default, llama.cpp's Q4_0 block), activations int8 on the CPU (the
# builder's default accuracy level there), symmetric
INT4_BLOCK = 32


def genai_precision(device: str) -> str:
    """What the builder builds for `device`: fp16 for CUDA, fp32 for the CPU."""
    return "fp16" if device == "cuda" else "fp32"


def build_genai(out: Path, device: str, int4: bool = False) -> list[str]:
    """The GenAI model of `out/hf`, in `out/genai` at `genai_precision(device)` (with `int4`, in `out/genai-int4`,
    its weights int4 in blocks of INT4_BLOCK); the files written. ValueError, with the builder's last line, where it
    cannot build the model."""
    precision, provider = "int4" if int4 else genai_precision(device), "cuda" if device == "cuda" else "cpu"
    folder = out / (GENAI_INT4_FOLDER if int4 else GENAI_FOLDER)
    extra = [*EXTRA_OPTIONS, f"block_size={INT4_BLOCK}"] if int4 else list(EXTRA_OPTIONS)
    with tempfile.TemporaryDirectory() as cache:
        command = [sys.executable, "-m", BUILDER, "-i", str(out / HF_FOLDER), "-o", str(folder)]
        command += ["-p", precision, "-e", provider, "-c", cache, "--extra_options", *extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise ValueError(
            f"onnxruntime-genai's builder cannot build this model ({precision}, {provider}): "
            f"{first_line(Exception(lines[-1] if lines else f'exit {done.returncode}'))}"
        )
    log.info("built the ONNX Runtime GenAI model (%s, %s)", precision, provider)
    return sorted(str(p.relative_to(out)) for p in folder.rglob("*") if p.is_file())
