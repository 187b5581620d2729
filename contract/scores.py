"""How a classifier's logits become its scores, by the manifest's `scores`, as transformers' pipeline decides it:
softmax for one label of several, sigmoid for independent labels or one, none for a regression head. The service
answers with them (serve/tasks/ranking.py); the export holds them to the pipeline's (export/reference.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Over the last axis: a classifier's classes (N x C), a token classifier's labels (N x tokens x labels)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Each logit alone: a score of independent labels, or of a one-logit model (a cross-encoder)."""
    return 1.0 / (1.0 + np.exp(-logits))


SCORE_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "softmax": softmax,
    "sigmoid": sigmoid,
    "none": lambda logits: logits,
}
