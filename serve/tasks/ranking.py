"""What the two classifiers (images, texts) share: their outputs ranked in the model thread, and their answers.

The softmax and each row's classes best first are computed once per batch, in the model thread: NumPy's sorts
release the GIL, and an argsort per request on the event loop handed the GIL to a decoding thread for up to its
5 ms switch interval each time (py-spy: 11% of the loop's samples at c=64, digits model).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from contract.scores import SCORE_FUNCTIONS
from serve.model.runtime import best_first
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.protocols.tensors import ServedTensor, select_outputs

CLASSIFIER_OUTPUTS = ("logits", "probabilities")
PREDICTIONS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "predictions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "index": {"type": "integer"},
                    "probability": {"type": "number"},
                },
            },
        }
    },
    "required": ["predictions"],
}


def ranked(logits: np.ndarray, scores: str = "softmax") -> dict[str, np.ndarray]:
    """The logits, their scores (`probabilities`: SCORE_FUNCTIONS[scores]) and each row's classes best first."""
    probabilities = SCORE_FUNCTIONS[scores](logits)
    return {"logits": logits, "probabilities": probabilities, "order": best_first(probabilities)}


def predictions(
    outputs: dict[str, np.ndarray], labels: list[str], top_k: int, key: str = "probability"
) -> list[dict[str, Any]]:
    """One request's classes, best first: the /classify answer's `predictions` (`key`: "score" for a regression
    head's values, which are no probabilities)."""
    probabilities = outputs["probabilities"][0].tolist()
    return [{"label": labels[i], "index": i, key: probabilities[i]} for i in outputs["order"][0, :top_k].tolist()]


def with_probabilities(outputs: list[ServedTensor]) -> list[ServedTensor]:
    """The protocol's outputs of a classifier: its logits, and their softmax beside them."""
    return [*outputs, ServedTensor("probabilities", "FP32", outputs[0].shape)]


def classifier_outputs(
    request: InferRequest,
    outputs: dict[str, np.ndarray],
    labels: list[str] | None,
    names: tuple[str, ...] = CLASSIFIER_OUTPUTS,
) -> list[OutputTensor]:
    return select_outputs(request, {name: outputs[name] for name in names}, labels)
