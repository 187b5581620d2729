"""A JSON request body -> a float32 array, checked for shape before anything is converted.

JSON numbers are slow to parse and large to hold (a Python float per element, ~30 bytes of text each): the
body is bounded by what the model can take before it is read (`max_json_bytes`), parsed off the event loop,
and its nesting measured along the first element of each level before NumPy converts it, so a body of the
wrong shape costs one walk down its first elements, not a conversion.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from contract.errors import ClientError

# The most characters one number takes in a JSON body, separators and indentation included: a float32 printed
# in full ("-1.2345678901234567e-05", 23 characters) with ", " and a pretty-printer's newline and indent.
CHARACTERS_PER_NUMBER = 48
SLACK_BYTES = 4096  # the object's keys and brackets


def max_json_bytes(max_rows: int, row_shape: tuple[int, ...]) -> int:
    """The largest JSON body that can hold `max_rows` rows of `row_shape` numbers."""
    return max_rows * math.prod(row_shape) * CHARACTERS_PER_NUMBER + SLACK_BYTES


def parse_json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as err:  # malformed, not UTF-8, too deep, NaN, or a number past a double
        raise ClientError(f"the body is not valid JSON ({str(err)[:120]}){not_json_numbers(body)}") from None


def not_json_numbers(body: bytes | memoryview) -> str:
    """A hint for the commonest invalid JSON a numeric client sends: Python's json.dumps writes NaN and Infinity."""
    sample = bytes(body[: 1 << 20])
    return "; NaN and Infinity are not JSON numbers" if b"NaN" in sample or b"Infinity" in sample else ""


def nested_shape(value: Any) -> list[int]:
    """The shape a nested list claims, read down its first elements (a ragged list is caught on conversion)."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def float32_rows(value: Any, name: str, row_shape: tuple[int, ...], max_rows: int) -> np.ndarray:
    """`value`, a nested list of [N, *row_shape] finite numbers with 1 <= N <= max_rows, as float32."""
    shape = nested_shape(value)
    expected = f"[N, {', '.join(map(str, row_shape))}]" if row_shape else "[N]"
    if len(shape) != 1 + len(row_shape) or tuple(shape[1:]) != row_shape or shape[0] < 1:
        raise ClientError(f"{name} has shape {shape}; expected {expected}")
    if shape[0] > max_rows:
        raise ClientError(f"{name} has {shape[0]} rows; at most {max_rows} per request (HANDOFF_MAX_BATCH_SIZE)")
    try:
        array = np.asarray(value, dtype=np.float32)
    except (ValueError, TypeError, OverflowError):
        raise ClientError(f"{name} must be a rectangular nested list of numbers within float32's range") from None
    if array.shape != (shape[0], *row_shape):
        raise ClientError(f"{name} is ragged: rows of different lengths; expected {expected}")
    if not np.isfinite(array).all():
        raise ClientError(f"{name} contains NaN or Inf, or numbers beyond float32's range")
    return array
