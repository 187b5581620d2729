"""The Open Inference Protocol's tensors as the served tasks name them: what a task declares it takes and gives
(`ServedTensor`), the inputs its infer decodes by name, and the outputs a request asks for (`select_outputs`).
The HTTP endpoints that use them are serve/protocols/oip.py's; a task needs only this vocabulary."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract.errors import ClientError
from serve.protocols.oip_codec import (
    InferRequest,
    OutputTensor,
    RequestedOutput,
    classification_strings,
    protocol_datatype,
)

IMAGE_INPUT = "image"  # an image task's encoded image files, decoded as its own route decodes them
AUDIO_INPUT = "audio"  # an audio task's encoded audio files, decoded as its own route decodes them
WAVEFORM_INPUT = "waveform"  # an audio task's samples at the model's rate, one clip a row
TEXT_INPUT = "text"  # a text task's UTF-8 texts, tokenized as its own route tokenizes them
TEXT_PAIR_INPUT = "text_pair"  # a pair model's second texts, one per row of `text`


@dataclass(frozen=True)
class ServedTensor:
    """A tensor as the protocol names it: its datatype (FP32, BYTES...) and shape (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def config(self) -> dict[str, Any]:
        """Triton's config entry: the dims after the batch, and TYPE_STRING for BYTES."""
        kind = "STRING" if self.datatype == "BYTES" else self.datatype
        entry: dict[str, Any] = {"name": self.name, "data_type": f"TYPE_{kind}", "dims": list(self.shape[1:])}
        if self.optional:
            entry["optional"] = True
        return entry


def select_outputs(
    request: InferRequest, available: dict[str, np.ndarray], labels: list[str] | None
) -> list[OutputTensor]:
    """The outputs the request asked for (all of them by default), each as binary or JSON as asked, and
    with `classification: k` as Triton's top-k strings."""
    wanted = request.outputs or _every_output(tuple(available))
    outputs = []
    for asked in wanted:
        if asked.name not in available:
            raise ClientError(f"unknown output {asked.name!r}; this model gives {', '.join(available)}")
        binary = request.binary_output if asked.binary is None else asked.binary
        value = available[asked.name]
        if asked.classification is not None:
            if value.ndim != 2 or not np.issubdtype(value.dtype, np.floating):
                raise ClientError(f"output {asked.name!r}: classification needs scores of shape [N, classes]")
            outputs.append(
                OutputTensor(asked.name, "BYTES", classification_strings(value, asked.classification, labels), binary)
            )
        else:
            outputs.append(OutputTensor(asked.name, protocol_datatype(value.dtype), value, binary))
    return outputs


@functools.cache
def _every_output(names: tuple[str, ...]) -> tuple[RequestedOutput, ...]:
    """What a request that names no outputs asks for: each of the model's (made once per set of names)."""
    return tuple(RequestedOutput(name, None, None) for name in names)
