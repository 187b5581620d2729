"""The Open Inference Protocol's infer messages (KServe V2 / Triton HTTP), bytes <-> arrays.

A request is a JSON header, optionally followed by binary tensor data (Triton's binary tensor extension:
the header's length in `Inference-Header-Content-Length`, each binary input's size in its
`parameters.binary_data_size`), the form `tritonclient.http` sends by default. Inputs come as NumPy arrays
(BYTES as a list of bytes objects), outputs go back as JSON `data` or as binary, as each was asked for.

Every size a client claims is checked against the bytes it sent before anything is allocated: a shape of
10^9 rows in a small body, a binary_data_size that disagrees with shape x datatype, a header length past the
body, a BYTES element whose 4-byte length runs past its tensor are all ClientError (400), and so is NaN or
Inf in a float input. Pure Python and NumPy: tests/unit/test_oip_codec.py drives it with hostile bodies.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson  # parses a JSON tensor's numbers several times faster than json

from contract.errors import ClientError
from serve.http.json_body import not_json_numbers
from serve.model.runtime import best_first

# The protocol's datatypes and NumPy's (little-endian, as the binary extension sends them); BYTES is a list.
DATATYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "bytes",
}
OIP_DATATYPE = {numpy: oip for oip, numpy in DATATYPES.items()}
# Each binary datatype's little-endian NumPy dtype, and each NumPy dtype's protocol name: made once, not per request
# (np.dtype(...).newbyteorder() and dtype.name cost microseconds each, on the event loop).
WIRE_DTYPES = {oip: np.dtype(numpy).newbyteorder("<") for oip, numpy in DATATYPES.items() if oip != "BYTES"}
_DATATYPE_OF = {np.dtype(numpy): oip for oip, numpy in DATATYPES.items() if oip != "BYTES"}
MAX_TENSORS = 64  # inputs or outputs one request may name
MAX_DIMS = 8
MAX_HEADER_DIGITS = 12
# A BYTES tensor holds one or a few items per row (an image file, a text): a row of more is refused before its
# elements are split out of the body (4,980,736 empty elements in 19 MB took 6.8 s to split, round 3).
MAX_BYTES_PER_ROW = 16
BINARY_MEDIA_TYPE = "application/octet-stream"


@dataclass(frozen=True)
class InputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    value: Any
    """np.ndarray of the datatype, or list[bytes] for BYTES"""


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool | None  # None: the request's default
    classification: int | None  # Triton's classification extension: the top k as "score:index:label"


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    inputs: dict[str, InputTensor]
    outputs: tuple[RequestedOutput, ...] | None  # None: every output
    binary_output: bool  # the request's default for its outputs


@dataclass(frozen=True)
class OutputTensor:
    name: str
    datatype: str
    value: Any  # np.ndarray, or for BYTES an np.ndarray of bytes objects (any shape)
    binary: bool


def protocol_datatype(dtype: np.dtype) -> str:
    """An output's datatype as the protocol names it: BYTES for Python objects (texts, labels)."""
    if dtype.kind == "O":
        return "BYTES"
    return _DATATYPE_OF.get(dtype) or OIP_DATATYPE[dtype.name]  # by its name: a dtype of the other byte order


def _header_length(value: bytes | None, body_size: int) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not (text.isdigit() and len(text) <= MAX_HEADER_DIGITS):
        raise ClientError(f"Inference-Header-Content-Length must be a whole number of bytes, got {text[:20]!r}")
    length = int(text)
    if not 0 < length <= body_size:
        raise ClientError(f"Inference-Header-Content-Length {length} is outside the body's {body_size} bytes")
    return length


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ClientError(f"{what} must be a JSON object")
    return value


def _shape(entry: dict[str, Any], name: str) -> tuple[int, ...]:
    shape = entry.get("shape")
    if type(shape) is list and len(shape) <= MAX_DIMS:
        for d in shape:
            if type(d) is not int or d < 0:  # a JSON number's exact type: a bool is no dimension
                break
        else:
            return tuple(shape)
    raise ClientError(f"input {name!r}: shape must be a list of at most {MAX_DIMS} whole numbers >= 0")


def _flatten(data: Any, limit: int) -> list[Any]:
    """A nested JSON list's leaves, in order; stops (and the caller refuses) past `limit` of them."""
    leaves: list[Any] = []
    stack = [iter(data if isinstance(data, list) else [data])]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            leaves.append(item)
            if len(leaves) > limit:
                return leaves
        else:
            stack.pop()
    return leaves


def _check_size(shape: tuple[int, ...], datatype: str, name: str, max_rows: int | None) -> None:
    """Refuse a tensor too large for one request by its shape alone, before its data is read."""
    if max_rows is not None and shape and shape[0] > max_rows:
        raise ClientError(f"input {name!r}: {shape[0]} rows; send 1 to {max_rows} per request (HANDOFF_MAX_BATCH_SIZE)")
    if datatype == "BYTES" and math.prod(shape[1:]) > MAX_BYTES_PER_ROW:
        raise ClientError(f"input {name!r}: at most {MAX_BYTES_PER_ROW} BYTES elements per row, shape {list(shape)}")


def split_bytes(chunk: memoryview, count: int, name: str) -> list[bytes]:
    """A BYTES tensor's binary form (each element: a 4-byte little-endian length, then its bytes)."""
    if count * 4 > len(chunk):  # every element takes 4 bytes at least: a claim the body cannot hold
        raise ClientError(f"input {name!r}: {count} BYTES elements cannot fit in {len(chunk)} bytes")
    elements, offset = [], 0
    while offset < len(chunk):
        if offset + 4 > len(chunk):
            raise ClientError(f"input {name!r}: a BYTES element's 4-byte length is cut off")
        (size,) = struct.unpack_from("<I", chunk, offset)
        if offset + 4 + size > len(chunk):
            raise ClientError(f"input {name!r}: a BYTES element of {size} bytes runs past its tensor")
        elements.append(bytes(chunk[offset + 4 : offset + 4 + size]))
        offset += 4 + size
    if len(elements) != count:
        raise ClientError(f"input {name!r}: shape holds {count} BYTES elements, the data {len(elements)}")
    return elements


def _binary_value(chunk: memoryview, datatype: str, shape: tuple[int, ...], name: str) -> Any:
    count = math.prod(shape)
    if datatype == "BYTES":
        return split_bytes(chunk, count, name)
    dtype = WIRE_DTYPES[datatype]
    if len(chunk) != count * dtype.itemsize:
        raise ClientError(
            f"input {name!r}: binary_data_size {len(chunk)} disagrees with shape {list(shape)} x {datatype} "
            f"({count * dtype.itemsize} bytes)"
        )
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


# The kinds of NumPy array a JSON `data` list may become for each family of datatypes: numbers for FP (ints
# too), whole numbers for the integer types, true/false for BOOL. Strings, objects and ragged lists never pass.
JSON_KINDS = {"FP": "if", "INT": "i", "UINT": "i", "BOOL": "b"}


def json_array(data: Any, datatype: str, name: str) -> np.ndarray:
    """A JSON list (flat or nested) as an array of `datatype`: NumPy converts it in C, and the kind it chose
    says whether every leaf was of the right sort (numbers for FP, whole numbers for integers, true/false for
    BOOL); strings, objects and ragged lists never pass."""
    try:
        array = np.asarray(data)
    except (ValueError, OverflowError):
        raise ClientError(f"input {name!r}: data must be a flat or rectangular nested list") from None
    family = next(prefix for prefix in ("FP", "UINT", "INT", "BOOL") if datatype.startswith(prefix))
    if array.dtype.kind not in JSON_KINDS[family] and array.size:
        sort = {"FP": "numbers", "INT": "whole numbers", "UINT": "whole numbers", "BOOL": "true/false"}[family]
        raise ClientError(f"input {name!r}: {datatype} data must be {sort}")
    target = np.dtype(DATATYPES[datatype])
    if array.dtype.kind == "i" and target.kind in "iu" and not fits_integers(array, target):
        raise ClientError(f"input {name!r}: a number is out of {datatype}'s range")
    return array.astype(target)


def fits_integers(array: np.ndarray, target: np.dtype) -> bool:
    """Whether every value of an integer array fits the integer type `target` (an empty array does)."""
    info = np.iinfo(target)
    return not array.size or (array.min() >= info.min and array.max() <= info.max)


def _json_value(data: Any, datatype: str, shape: tuple[int, ...], name: str) -> Any:
    count = math.prod(shape)
    if datatype == "BYTES":
        leaves = _flatten(data, count)
        if len(leaves) != count:
            raise ClientError(f"input {name!r}: shape {list(shape)} holds {count} elements, data has {len(leaves)}")
        if not all(isinstance(leaf, str) for leaf in leaves):
            raise ClientError(f"input {name!r}: BYTES data in JSON must be strings")
        return [leaf.encode() for leaf in leaves]
    array = json_array(data, datatype, name)
    if array.size != count:
        raise ClientError(f"input {name!r}: shape {list(shape)} holds {count} elements, data has {array.size}")
    return array.reshape(shape)


def _requested_outputs(entries: Any) -> tuple[RequestedOutput, ...] | None:
    if entries is None:
        return None
    if not isinstance(entries, list) or len(entries) > MAX_TENSORS:
        raise ClientError(f"outputs must be a list of at most {MAX_TENSORS} objects")
    requested = []
    for entry in entries:
        entry = _object(entry, "each output")
        name, parameters = entry.get("name"), _object(entry.get("parameters") or {}, "an output's parameters")
        binary, k = parameters.get("binary_data"), parameters.get("classification")
        if not isinstance(name, str):
            raise ClientError("each output needs a name")
        if binary is not None and not isinstance(binary, bool):
            raise ClientError(f"output {name!r}: binary_data must be true or false")
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1000):
            raise ClientError(f"output {name!r}: classification must be a whole number from 1 to 1000")
        requested.append(RequestedOutput(name, binary, k))
    return tuple(requested)


def parse_infer_request(body: bytes, header_length: bytes | None, max_rows: int | None = None) -> InferRequest:
    """An infer request's body (and its Inference-Header-Content-Length header, if sent), checked; `max_rows`:
    the most rows (dimension 0) an input may have, checked on its shape before its data is read."""
    length = _header_length(header_length, len(body))
    view = memoryview(body)
    header, binary = (view, view[len(view) :]) if length is None else (view[:length], view[length:])
    try:
        document = _object(orjson.loads(header), "the request")
    except orjson.JSONDecodeError as err:
        raise ClientError(
            f"the request's JSON header is not valid JSON ({str(err)[:120]}){not_json_numbers(header)}"
        ) from None
    entries = document.get("inputs")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_TENSORS:
        raise ClientError(f"inputs must be a list of 1 to {MAX_TENSORS} tensors")
    inputs: dict[str, InputTensor] = {}
    offset = 0
    for entry in entries:
        entry = _object(entry, "each input")
        name, datatype = entry.get("name"), entry.get("datatype")
        if not isinstance(name, str) or name in inputs:
            raise ClientError(f"each input needs a distinct name, got {name!r}")
        if datatype not in DATATYPES:
            raise ClientError(f"input {name!r}: datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
        shape = _shape(entry, name)
        _check_size(shape, datatype, name, max_rows)
        parameters = entry.get("parameters") or {}
        if not isinstance(parameters, dict):  # (its message made only when it is wrong)
            raise ClientError(f"input {name!r}'s parameters must be a JSON object")
        size = parameters.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
                raise ClientError(
                    f"input {name!r}: binary_data_size {size!r} runs past the {len(binary)} bytes of binary data"
                )
            value = _binary_value(binary[offset : offset + size], datatype, shape, name)
            offset += size
        elif "data" in entry:
            value = _json_value(entry["data"], datatype, shape, name)
        else:
            raise ClientError(f"input {name!r}: has neither data nor parameters.binary_data_size")
        if datatype.startswith("FP") and not np.isfinite(value).all():
            raise ClientError(f"input {name!r}: contains NaN or Inf")
        inputs[name] = InputTensor(name, datatype, shape, value)
    if offset != len(binary):
        raise ClientError(f"{len(binary) - offset} bytes of binary data follow the inputs that no input claims")
    parameters = _object(document.get("parameters") or {}, "the request's parameters")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise ClientError("parameters.binary_data_output must be true or false")
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ClientError("id must be a string")
    return InferRequest(request_id, inputs, _requested_outputs(document.get("outputs")), binary_output)


def _bytes_tensor(elements: Any) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def encode_infer_response(
    model_name: str, model_version: str, request_id: str | None, outputs: list[OutputTensor]
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The response body and its headers: JSON alone, or JSON then the binary outputs in order."""
    described, chunks = [], []
    for output in outputs:
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": list(output.value.shape)}
        if output.datatype == "BYTES":
            flat = output.value.reshape(-1).tolist()
            data: Any = _bytes_tensor(flat) if output.binary else [e.decode() for e in flat]
        else:
            array = np.ascontiguousarray(output.value, dtype=WIRE_DTYPES[output.datatype])
            data = array.tobytes() if output.binary else array.reshape(-1)  # orjson writes the array itself
        if isinstance(data, bytes):
            entry["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            entry["data"] = data
        described.append(entry)
    document: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": described}
    if request_id is not None:
        document["id"] = request_id
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, [(b"content-type", b"application/json")]
    return b"".join([header, *chunks]), [
        (b"content-type", BINARY_MEDIA_TYPE.encode()),
        (b"inference-header-content-length", str(len(header)).encode()),
    ]


def classification_strings(scores: np.ndarray, k: int, labels: list[str] | None) -> np.ndarray:
    """Triton's classification extension: for each row its top k as b"score:index:label", best first."""
    k = min(k, scores.shape[1])
    top = best_first(scores)[:, :k]
    rows = []
    for row, indices in zip(scores, top):
        rows.append([(f"{row[i]:f}:{i}" + (f":{labels[i]}" if labels else "")).encode() for i in indices.tolist()])
    return np.array(rows, dtype=object).reshape(len(rows), k)
