"""Any model's request, checked against its signature before it reaches the batcher: the inputs it names, their
datatypes and shapes, one batch size for all, within HANDOFF_MAX_BATCH_SIZE, finite floats.

Conversions: a float input is taken as FP16, FP32 or FP64 and converted to the model's float type; an integer
input as any integer type whose values fit the model's (JSON's numbers arrive as int64). Anything else
(floats for integers, integers for floats, booleans for numbers) is refused: a silent cast would answer a
different question than the one asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from contract.errors import ClientError
from contract.signature import Signature, TensorSpec
from serve.protocols.oip_codec import OIP_DATATYPE, fits_integers, json_array


def _convert(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    target = np.dtype(spec.dtype)
    if array.dtype == target:
        return array
    if array.dtype.kind == "f" and target.kind == "f":
        converted = array.astype(target)
        if not np.isfinite(converted).all():
            raise ClientError(f"input {spec.name!r}: values beyond {OIP_DATATYPE[spec.dtype]}'s range")
        return converted
    if array.dtype.kind in "iu" and target.kind in "iu":
        if not fits_integers(array, target):
            raise ClientError(f"input {spec.name!r}: a value is out of {OIP_DATATYPE[spec.dtype]}'s range")
        return array.astype(target)
    given = OIP_DATATYPE.get(array.dtype.name, array.dtype.name)
    raise ClientError(f"input {spec.name!r} is {OIP_DATATYPE[spec.dtype]}, not {given}")


def _fits(shape: tuple[int, ...], wanted: tuple[int, ...]) -> bool:
    """`shape` against the signature's (-1: any size), no dimension after the batch empty."""
    if len(shape) != len(wanted) or 0 in shape[1:]:
        return False
    for got, want in zip(shape[1:], wanted[1:]):
        if want != -1 and got != want:
            return False
    return True


def _check_shape(array: np.ndarray, spec: TensorSpec) -> None:
    if not _fits(array.shape, spec.shape):  # the message is made only for a shape refused
        expected = ", ".join("N" if i == 0 else "*" if d == -1 else str(d) for i, d in enumerate(spec.shape))
        raise ClientError(f"input {spec.name!r} has shape {list(array.shape)}; expected [{expected}] (*: any size)")


def model_inputs(given: dict[str, np.ndarray], signature: Signature, max_rows: int) -> dict[str, np.ndarray]:
    """`given`, checked and converted to what the model takes; ClientError (400) says what is wrong."""
    names = [spec.name for spec in signature.inputs]
    missing, unknown = sorted(set(names) - set(given)), sorted(set(given) - set(names))
    if missing or unknown:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(unknown)}"] if unknown else []
        )
        raise ClientError(f"inputs: {'; '.join(parts)}; this model takes {', '.join(names)}")
    checked = {}
    for spec in signature.inputs:
        array = _convert(np.asarray(given[spec.name]), spec)
        _check_shape(array, spec)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise ClientError(f"input {spec.name!r}: contains NaN or Inf")
        checked[spec.name] = np.ascontiguousarray(array)
    rows = {len(a) for a in checked.values()}
    if len(rows) != 1:
        sizes = ", ".join(f"{n} {len(a)}" for n, a in checked.items())
        raise ClientError(f"inputs disagree on the batch (dimension 0): {sizes}")
    check_rows(next(iter(rows)), max_rows)
    return checked


def check_answer_size(outputs: dict[str, np.ndarray], max_numbers: int) -> None:
    """Refuse an answer larger than one response may carry, before it is converted to JSON or binary: a 29 KB
    request to an outer-product model made a 172 MB answer and a 2 GB peak (security round 3, item 10)."""
    numbers = sum(int(np.size(value)) for value in outputs.values())
    if numbers > max_numbers:
        raise ClientError(
            f"the model's answer holds {numbers} numbers, more than the {max_numbers} one response may carry "
            "(HANDOFF_MAX_BODY_MB x 65,536); send fewer rows",
            status=413,
        )


def outputs_json(outputs: dict[str, np.ndarray]) -> bytes:
    """Any model's /predict answer, `{"outputs": {name: nested list}}`, as JSON bytes (in a thread: megabytes)."""
    contiguous = {name: np.ascontiguousarray(value) for name, value in outputs.items()}  # what orjson requires
    return orjson.dumps({"outputs": contiguous}, option=orjson.OPT_SERIALIZE_NUMPY)


def check_rows(rows: int, max_rows: int) -> None:
    if not 1 <= rows <= max_rows:
        raise ClientError(f"{rows} rows; send 1 to {max_rows} per request (HANDOFF_MAX_BATCH_SIZE)")


def json_inputs(document: Any, signature: Signature) -> dict[str, np.ndarray]:
    """POST /predict's `{"inputs": {name: nested list}}` as arrays of the model's datatypes (checked after)."""
    if not isinstance(document, dict) or set(document) != {"inputs"} or not isinstance(document["inputs"], dict):
        example = ", ".join(f'"{t.name}": [...]' for t in signature.inputs)
        raise ClientError(f'expected a JSON object {{"inputs": {{{example}}}}}')
    specs = {t.name: t for t in signature.inputs}
    return {
        name: json_array(value, OIP_DATATYPE[specs[name].dtype], name) if name in specs else np.asarray([])
        for name, value in document["inputs"].items()
    }
