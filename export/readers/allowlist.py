"""What a checkpoint's pickle may construct, beyond tensors and plain containers.

Training scripts keep harmless metadata beside their weights: torchvision's references and timm save their
`argparse.Namespace` as `args`, and many scripts keep numpy scalars (an `np.float64` accuracy). Torch's
`weights_only=True` loader refuses those by default. `FIELD_SAFE_GLOBALS` lets exactly these types
through torch's own safe-globals mechanism: the loader still constructs nothing else, and a Namespace whose
contents name a function or carry a reduce payload is refused at that global, before anything runs.

`torch.distributed.checkpoint` writes its `.metadata` with plain pickle (DCP's own reader unpickles it
with no restriction), so `read_dcp_metadata` reads it with an unpickler that knows only DCP's metadata
classes.
"""

from __future__ import annotations

import argparse
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

_NUMPY_DTYPES = [
    type(np.dtype(kind))
    for kind in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
]

FIELD_SAFE_GLOBALS: list[Any] = [
    argparse.Namespace,
    np.dtype,
    *_NUMPY_DTYPES,
    np._core.multiarray.scalar,  # type: ignore[attr-defined]
    (np._core.multiarray.scalar, "numpy.core.multiarray.scalar"),  # type: ignore[attr-defined]  # as numpy 1.x names it in older files
]

# (module, name) of everything a DCP .metadata file holds (torch 2.x), and nothing else.
_DCP_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


class UnsafeMetadata(pickle.UnpicklingError):
    """A DCP metadata file that names something other than DCP's own metadata classes."""


class _DcpMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _DCP_METADATA_GLOBALS:
            return super().find_class(module, name)
        raise UnsafeMetadata(f"{module}.{name}")


def read_dcp_metadata(path: Path) -> Any:
    """A DCP `.metadata` file, unpickled with only DCP's metadata classes allowed."""
    import torch.distributed.checkpoint.filesystem  # noqa: F401 - registers the classes find_class returns

    return _DcpMetadataUnpickler(io.BytesIO(Path(path).read_bytes())).load()
