"""Checkpoints that are folders: `torch.distributed.checkpoint` (DCP) and Hugging Face Accelerate's `save_state`.

DCP, as FSDP2 and torchtitan write it: `step-N/` with `.metadata` and one `__R_0.distcp` per rank.
torchtitan keeps the model's keys at the top level beside `optimizer`, `lr_scheduler`, `dataloader` and
`train_state`; other scripts nest them under `model`, and PyTorch's own FSDP2 recipe one level deeper, in a
stateful object (`{"app": AppState(model, optimizer)}`: `app.model.*` beside `app.optim.*`). The model's tensors
are found by that structure (`_model_keys`), never by a first key segment. It is read in this one process, with
no process group: sharded DTensors come back whole, and only the model's tensors are read, never the optimizer's, so
exporting a large run does not need its optimizer's memory. Given the folder that holds the `step-N`
folders, the newest step is read.

Accelerate: `model.safetensors` or `pytorch_model.bin` (with an `.index.json` and shards when large), beside
`optimizer.bin`, `scheduler.bin` and `random_states_*.pkl`, which are never opened; under FSDP its
`pytorch_model_fsdp_0/` is a DCP folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

from contract.manifest import sha256_file
from export.readers.allowlist import FIELD_SAFE_GLOBALS, UnsafeMetadata, read_dcp_metadata
from export.readers.containers import EMA_KEYS, Source, read_safetensors
from train.checkpoint import CheckpointError, read_weights_only

log = logging.getLogger(__name__)

DCP_METADATA = ".metadata"
NOT_MODEL = {
    "optimizer",
    "optim",
    "optimizers",
    "lr_scheduler",
    "lr_schedulers",
    "scheduler",
    "dataloader",
    "train_state",
    "rng",
    "rng_state",
    "scaler",
    "extra_state",
    "sampler",
}
ACCELERATE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
ACCELERATE_FSDP = "pytorch_model_fsdp_0"


def _folder_sha256(folder: Path, files: list[Path]) -> str:
    """One digest for the files read: sha256 over each file's relative name and sha256, in name order."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path.relative_to(folder)}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def _newest_step(folder: Path) -> Path | None:
    steps = [p for p in folder.iterdir() if p.is_dir() and (p / DCP_METADATA).is_file()]
    numbered = [(int(m.group(1)), p) for p in steps if (m := re.search(r"(\d+)$", p.name))]
    return max(numbered)[1] if numbered else (steps[0] if len(steps) == 1 else None)


def _container(key: str) -> list[str]:
    """The segments of a DCP key that name where it is kept, not what it is: up to and including the first `model`
    segment (`app.model.` in PyTorch's FSDP2 recipe), or every segment where there is none (an optimizer's state is
    keyed by parameter names, so any segment may say it is training state)."""
    parts = key.split(".")
    return parts[: parts.index("model") + 1] if "model" in parts else parts


def _model_keys(keys: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(model key -> DCP key, EMA key -> DCP key), found by structure, at any depth of nested stateful objects:
    a key whose container names training state (NOT_MODEL: the optimizer's, the scheduler's) is not the model's;
    one whose container names EMA weights is the EMA's; of the rest, the common prefix up to its first `model`
    segment is the container and is removed (`model.`, `app.model.`); export/unwrap.py removes anything deeper
    only where that makes the keys the model's own."""
    model: list[str] = []
    ema: list[str] = []
    for key in keys:
        container = _container(key)
        if any(part in NOT_MODEL for part in container):
            continue
        (ema if any(part in EMA_KEYS for part in container) else model).append(key)
    return _without_container(model, ("model",)), _without_container(ema, EMA_KEYS)


def _without_container(keys: list[str], ends: tuple[str, ...]) -> dict[str, str]:
    """{key less the container: DCP key}: the container is the keys' common prefix up to its first segment in
    `ends` (none: nothing is removed)."""
    if not keys:
        return {}
    common = keys[0].split(".")[:-1]
    for key in keys[1:]:
        parts = key.split(".")
        while common and parts[: len(common)] != common:
            common.pop()
    cut = next((i + 1 for i, part in enumerate(common) if part in ends), 0)
    return {key.split(".", cut)[-1] if cut else key: key for key in keys}


class _SafeReader(dcp.FileSystemReader):
    """DCP's file reader, but its metadata unpickled with only DCP's own classes allowed."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        metadata = read_dcp_metadata(Path(self.path) / DCP_METADATA)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _check_storage(folder: Path, metadata: Any, wanted: list[TensorStorageMetadata]) -> None:
    """Refuse what the metadata claims before anything is allocated or opened by it: a storage file outside the
    folder (`../`, an absolute path, a link), or tensors larger than every shard file together holds."""
    root = folder.resolve()
    names = {getattr(item, "relative_path", "") for item in (getattr(metadata, "storage_data", None) or {}).values()}
    for name in sorted(names):
        target = folder / name
        if Path(name).is_absolute() or target.resolve().parent != root or target.is_symlink():
            raise CheckpointError(
                f"{folder / DCP_METADATA}: names the storage file {name!r}, which is not a file in its own folder; "
                "refused"
            )
    claimed = sum(math.prod(m.size) * m.properties.dtype.itemsize for m in wanted)
    held = sum(p.stat().st_size for p in folder.glob("*.distcp") if p.is_file() and not p.is_symlink())
    if claimed > held + (1 << 20):  # every byte of a tensor is in a shard file, beside a little framing
        raise CheckpointError(
            f"{folder / DCP_METADATA}: claims {claimed} bytes of model tensors, but its shard files hold {held}; "
            "damaged or forged metadata, refused before allocating"
        )


def read_dcp(folder: Path) -> Source:
    try:
        metadata = read_dcp_metadata(folder / DCP_METADATA)
    except UnsafeMetadata as err:
        raise CheckpointError(
            f"{folder / DCP_METADATA}: names {err}, which a DCP metadata file never holds; refused without running it"
        ) from None
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a damaged file
        raise CheckpointError(f"{folder / DCP_METADATA}: not a readable DCP metadata file ({err})") from None
    tensors = {k: m for k, m in metadata.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    model_keys, ema_keys = _model_keys(list(tensors))
    if not model_keys:
        raise CheckpointError(
            f"{folder}: a DCP checkpoint without model tensors (top-level entries: "
            f"{', '.join(sorted({k.split('.')[0] for k in tensors})[:8])})"
        )
    wanted = {**model_keys, **ema_keys}
    _check_storage(folder, metadata, [tensors[k] for k in wanted.values()])
    # Only these entries are planned, so only their bytes are read: never the optimizer's.
    state = {
        dcp_key: torch.empty(tensors[dcp_key].size, dtype=tensors[dcp_key].properties.dtype)
        for dcp_key in wanted.values()
    }
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process, on purpose
            dcp.load(state, storage_reader=_SafeReader(str(folder)), no_dist=True)
    except Exception as err:  # noqa: BLE001 - DCP wraps read errors in its own exception types
        raise CheckpointError(
            f"{folder}: cannot read its tensors ({str(err).strip().splitlines()[-1][:200]})"
        ) from None
    shards = sorted(folder.glob("*.distcp"))
    src = Source(
        folder,
        _folder_sha256(folder, [folder / DCP_METADATA, *shards]),
        "dcp",
        {key: state[dcp_key] for key, dcp_key in model_keys.items()},
    )
    if ema_keys:
        src.ema_state_dict = {key: state[dcp_key] for key, dcp_key in ema_keys.items()}
        src.ema_key = next(iter(ema_keys.values())).split(".", 1)[0]  # the entry that holds them
    log.info("read %d model tensors from %d DCP shard(s) in %s", len(model_keys), len(shards), folder)
    return src


def _read_index(folder: Path, index: Path) -> tuple[dict[str, torch.Tensor], list[Path]]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CheckpointError(f"{index}: not a weight index ({err})") from None
    shards = sorted({folder / name for name in weight_map.values()})
    outside = [p.name for p in shards if p.parent != folder]
    if outside:
        raise CheckpointError(f"{index}: names shards outside its folder ({', '.join(outside[:3])})")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(_read_weights(shard).state_dict)
    return state, shards


def _read_weights(path: Path) -> Source:
    if path.suffix == ".safetensors":
        return read_safetensors(path, kind="accelerate")
    obj = read_weights_only(path, safe_globals=FIELD_SAFE_GLOBALS)
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a state_dict of tensors")
    return Source(path, sha256_file(path), "accelerate", obj)


def read_accelerate(folder: Path) -> Source:
    """The folder's weights, safetensors first as transformers and Accelerate load them; a `pytorch_model.bin` beside
    them is set aside, said in the log and the manifest's `source.set_aside`."""
    for at, name in enumerate(ACCELERATE_WEIGHTS):
        index = folder / f"{name}.index.json"
        if index.is_file():
            state, shards = _read_index(folder, index)
            src = Source(folder, _folder_sha256(folder, [index, *shards]), "accelerate", state)
        elif (folder / name).is_file():
            src = _read_weights(folder / name)
            others = sorted(p.name for p in folder.glob(name.replace(".", "_*.")))
            if others:
                log.warning("%s holds more models (%s); exporting the first, %s", folder, ", ".join(others), name)
            src.path, src.kind = folder, "accelerate"
        else:
            continue
        src.set_aside = _set_aside(folder, name, ACCELERATE_WEIGHTS[at + 1 :])
        return src
    return read_dcp(folder / ACCELERATE_FSDP)


def _set_aside(folder: Path, read: str, later: tuple[str, ...]) -> list[str]:
    """The weight files of `later` kinds in `folder`, which loading `read` leaves unread, each with why."""
    found = [n for name in later for n in (name, f"{name}.index.json") if (folder / n).is_file()]
    for name in found:
        log.warning("%s: %s is set aside: %s is read first, as transformers reads it", folder, name, read)
    return [f"{name}: {read} is read first, as transformers reads it" for name in found]


def read_folder(folder: Path) -> Source:
    """A DCP or Accelerate folder, or CheckpointError naming what the folder holds instead."""
    if (folder / DCP_METADATA).is_file():
        return read_dcp(folder)
    if (
        any((folder / n).is_file() or (folder / f"{n}.index.json").is_file() for n in ACCELERATE_WEIGHTS)
        or (folder / ACCELERATE_FSDP / DCP_METADATA).is_file()
    ):
        return read_accelerate(folder)
    step = _newest_step(folder)
    if step is not None:
        log.info("%s holds DCP checkpoints; reading the newest, %s", folder, step.name)
        return read_dcp(step)
    found = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    raise CheckpointError(
        f"{folder}: a folder, but neither a torch.distributed.checkpoint folder ({DCP_METADATA}) "
        f"nor an Accelerate save_state folder ({', '.join(ACCELERATE_WEIGHTS)}); found: "
        f"{', '.join(found[:8]) or 'nothing'}" + (f" and {len(found) - 8} more" if len(found) > 8 else "")
    )
