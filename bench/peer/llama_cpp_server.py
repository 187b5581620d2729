"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server ARGS`) with llama.cpp's extra CPU buffer
types off (`use_extra_bufts`, llama-server's --no-repack): on this benchmark's Q4_0 model, llama.cpp's repacked AMX
path ended the process with SIGSEGV at the first token (an Intel Xeon with AMX, llama-cpp-python 0.3.36); f32
weights are never repacked. bench/llama_cpp_peer.py says so beside its figures.

    python bench/peer/llama_cpp_server.py ARGS...
"""

from __future__ import annotations

import llama_cpp
import llama_cpp.llama
from llama_cpp.server.__main__ import main

DEFAULT_PARAMS = llama_cpp.llama_model_default_params


def without_repacking() -> llama_cpp.llama_model_params:
    params = DEFAULT_PARAMS()
    params.use_extra_bufts = False
    return params


if __name__ == "__main__":
    llama_cpp.llama.llama_cpp.llama_model_default_params = without_repacking
    main()
