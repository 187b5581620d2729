"""The classes a classifier's answers rank best first: ties go to the lower index, as argmax breaks them."""

from __future__ import annotations

import numpy as np

from contract.scores import softmax
from serve.model.runtime import best_first
from serve.protocols.oip_codec import classification_strings


def test_ties_rank_in_index_order():
    scores = np.array([[0.1, 0.3, 0.3, 0.0, 0.3], [0.25, 0.25, 0.25, 0.25, 0.0]], dtype=np.float32)
    assert best_first(scores).tolist() == [[1, 2, 4, 0, 3], [0, 1, 2, 3, 4]]
    assert [s.split(b":")[1] for s in classification_strings(scores, 3, None)[0]] == [b"1", b"2", b"4"]


def test_the_first_ranked_class_is_argmax_on_quantized_scores():
    """INT8 logits take few distinct values: many rows hold exact ties, where an unstable sort disagreed."""
    logits = np.random.default_rng(0).integers(-3, 4, size=(2000, 10)).astype(np.float32) * 0.25
    probabilities = softmax(logits)
    assert (best_first(probabilities)[:, 0] == probabilities.argmax(1)).all()
