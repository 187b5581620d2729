"""The checkpoint readers, behind one entry point: `read_source(path)` reads any checkpoint a user is likely to hold
(a file: containers.py; a folder: folders.py) on the CPU and finds the weights inside it, or raises CheckpointError
saying why. Beside it: which of several checkpoints to export (choose.py), a Hugging Face folder and its tokenizer
(hf_checkpoint.py), and what unpickling may build (allowlist.py).
"""

from __future__ import annotations

from pathlib import Path

from export.readers.containers import EMA_KEYS, Source, choose_weights, read_file, read_safetensors
from export.readers.folders import read_folder


def read_source(path: str | Path, trust_pickle: bool = False, ema: bool = False) -> Source:
    """Load `path` (a file or a folder) on the CPU and locate its weights (its EMA weights with `ema`)."""
    path = Path(path)
    if path.is_dir():
        return choose_weights(read_folder(path), ema)
    if path.suffix == ".safetensors":
        return choose_weights(read_safetensors(path), ema)
    return choose_weights(read_file(path, trust_pickle), ema)


__all__ = ["EMA_KEYS", "Source", "read_source"]
