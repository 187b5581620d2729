"""Run in the llama.cpp peer's virtualenv (llama-cpp-python): quantize a GGUF to Q4_0 with llama.cpp's own
`llama_model_quantize` (its blocks of 32 weights, as handoff's int4), and say how llama.cpp tokenizes the benchmark's
prompts, so that the benchmark compares the two on the same ids.

    python bench/peer/llama_cpp_model.py quantize F32.gguf Q4_0.gguf
    python bench/peer/llama_cpp_model.py tokenize MODEL.gguf PROMPTS.json   # prints the ids as JSON
"""

from __future__ import annotations

import ctypes
import json
import sys

import llama_cpp


def main() -> None:
    command, model, other = sys.argv[1], sys.argv[2], sys.argv[3]
    if command == "quantize":
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
        if llama_cpp.llama_model_quantize(model.encode(), other.encode(), ctypes.byref(params)) != 0:
            raise SystemExit(f"llama_model_quantize could not quantize {model}")
        return
    loaded = llama_cpp.Llama(model, n_ctx=512, vocab_only=True, verbose=False)
    with open(other, encoding="utf-8") as f:
        prompts = json.load(f)
    print(json.dumps([loaded.tokenize(prompt.encode()) for prompt in prompts]))


if __name__ == "__main__":
    main()
