"""llama.cpp's own converter (convert_hf_to_gguf.py, from llama-cpp-python's source distribution) run on a Hugging
Face folder, with its BPE pre-tokenizer named: the converter knows a pre-tokenizer by a hash of the ids a test text
gets, so a tokenizer trained on the spot, whose vocabulary no hash names, is refused ("BPE pre-tokenizer was not
recognized"). The benchmark's tokenizer splits words as GPT-2's does (tokenizers' ByteLevel pre-tokenizer, its
regex), which llama.cpp calls "gpt-2"; bench/llama_cpp_peer.py checks that llama.cpp's ids then equal handoff's.

    python bench/peer/llama_cpp_convert.py LLAMA_CPP_SOURCE PRE_TOKENIZER -- CONVERTER_ARGS...
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    source, pre_tokenizer, arguments = Path(sys.argv[1]), sys.argv[2], sys.argv[4:]
    sys.path[:0] = [str(source), str(source / "gguf-py")]
    import convert_hf_to_gguf  # the converter's own module, from the source distribution
    from conversion.base import TextModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre_tokenizer
    sys.argv = ["convert_hf_to_gguf.py", *arguments]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
