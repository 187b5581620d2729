"""Parity for a detector: the same detections, matched best first, not the same tensors.

Two runs of one detector may list near-equal detections in another order, and a detection whose score sits at
the model's threshold (or at the last place of its detections per image) may be kept by one and not the other.
So each of the reference's detections, best first, is matched to one the artifact found with the same label, a
box within BOX_TOLERANCE_PX on every corner and a score within SCORE_TOLERANCE. Left unmatched, and not counted:
a detection within SCORE_TOLERANCE of where the list is cut (the score threshold, or the lowest score kept when
the list is full), and, past each image's TOP_MATCHED best, one for which the other side kept instead a box of the
same label overlapping it past the NMS threshold with a score within SCORE_TOLERANCE (NMS keeps one of two such
boxes, and the last digits decide which).

What is left may still differ in the tail: a model with little training scores many of its region proposals
alike, and which of near-equal proposals the RPN keeps (its top-n) changes what the second stage finds there
(fasterrcnn_mobilenet_v3_large_320_fpn after 6 steps: 98% of 400 detections matched, the rest past the 80th
place of 100). So the check asks that each image's TOP_MATCHED best detections all match (less any tied with the
next one), and MIN_MATCHED_SHARE of all of them. Plain NumPy: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BOX_TOLERANCE_PX = 1.0  # in the image's own pixels
SCORE_TOLERANCE = 1e-3
TOP_MATCHED = 10  # each image's best detections, which must all be matched
MIN_MATCHED_SHARE = 0.95  # of all the reference's detections


@dataclass(frozen=True)
class Detections:
    """One image's detections: boxes N x 4 (x1, y1, x2, y2), scores N, labels N."""

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class Matched:
    matched: int
    of: int  # the reference's detections
    unmatched: int  # on either side, past the cut, after swaps
    worst_box_px: float
    worst_score: float
    reason: str | None  # None: each of the TOP_MATCHED best agrees
    pairs: tuple[tuple[int, int], ...] = ()  # (reference's index, other's index) of each match


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Intersection over union of one box (x1, y1, x2, y2) with each of `boxes`."""
    x1, y1 = np.maximum(box[0], boxes[:, 0]), np.maximum(box[1], boxes[:, 1])
    x2, y2 = np.minimum(box[2], boxes[:, 2]), np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-9)


def match_detections(
    reference: Detections, other: Detections, score_threshold: float, detections_per_image: int, nms_threshold: float
) -> Matched:
    """How `other` compares with `reference` (the module's rule)."""
    order = np.argsort(-reference.scores, kind="stable")
    # the best, less any tied with the first one past them (a tie's order is not the model's)
    below = float(reference.scores[order[TOP_MATCHED]]) if len(order) > TOP_MATCHED else -1.0
    best = {int(i) for i in order[:TOP_MATCHED] if reference.scores[i] > below + SCORE_TOLERANCE}
    taken = np.zeros(len(other.scores), dtype=bool)
    cut = score_threshold
    if len(reference.scores) >= detections_per_image and len(reference.scores):
        cut = max(cut, float(reference.scores.min()))
    worst_box = worst_score = 0.0
    pairs = []
    missing = []
    for i in map(int, order):
        box_gap = np.abs(other.boxes - reference.boxes[i]).max(axis=1) if len(other.boxes) else np.zeros(0)
        score_gap = np.abs(other.scores - reference.scores[i])
        fits = (~taken) & (other.labels == reference.labels[i]) & (box_gap <= BOX_TOLERANCE_PX)
        fits &= score_gap <= SCORE_TOLERANCE
        if fits.any():
            j = int(np.flatnonzero(fits)[np.argmin(score_gap[fits])])
            taken[j] = True
            pairs.append((i, j))
            worst_box, worst_score = max(worst_box, float(box_gap[j])), max(worst_score, float(score_gap[j]))
        elif reference.scores[i] > cut + SCORE_TOLERANCE:
            missing.append(i)
    unmatched, reason = 0, None
    for i in missing:  # a swap is accepted past the best only: there, a moved box must match
        if i not in best and _swap(reference, i, other, taken, nms_threshold):
            continue
        unmatched += 1
        if i in best and reason is None:
            reason = _described(reference, i, f"among the {TOP_MATCHED} best, not found")
    extra = [int(j) for j in np.flatnonzero(~taken) if other.scores[j] > cut + SCORE_TOLERANCE]
    if extra and reason is None and other.scores[extra[0]] > below + SCORE_TOLERANCE:
        reason = _described(other, extra[0], f"among the {TOP_MATCHED} best, found only by the artifact")
    return Matched(len(pairs), len(order), unmatched + len(extra), worst_box, worst_score, reason, tuple(pairs))


def _swap(reference: Detections, i: int, other: Detections, taken: np.ndarray, nms_threshold: float) -> bool:
    """Whether `other` kept, instead of reference's detection i, an overlapping box NMS could have kept instead;
    marks it taken."""
    if not len(other.boxes):
        return False
    swap = (~taken) & (other.labels == reference.labels[i])
    swap &= np.abs(other.scores - reference.scores[i]) <= SCORE_TOLERANCE
    swap &= iou(reference.boxes[i], other.boxes) > nms_threshold
    if swap.any():
        taken[int(np.flatnonzero(swap)[0])] = True
    return bool(swap.any())


def _described(detections: Detections, i: int, what: str) -> str:
    box = ", ".join(f"{v:.1f}" for v in detections.boxes[i])
    return f"a detection {what}: label {int(detections.labels[i])}, score {detections.scores[i]:.4f}, box [{box}]"
