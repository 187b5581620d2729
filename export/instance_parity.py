"""Parity for what a detection carries beside its box: Mask R-CNN's mask and Keypoint R-CNN's keypoints, compared
on each pair of detections export/detection_parity.py matched (the same object found by the eager model and by the
graph).

- **Masks**: the graph's M x M mask pasted as the service pastes it (contract/instances.py) against the mask the
  untouched eager model pasted, both thresholded at 0.5 as they are answered: the pixels they disagree on, as a share
  of the pixels either claims, at most MASK_DISAGREEMENT for each pair (a matched box may differ by a fraction of a
  pixel, which moves where the mask is pasted by a pixel: so a pixel within EDGE_PX of eager's mask's edge is not
  counted, nor one whose eager probability is within MASK_TIE of the threshold, a tie, as a detection at the
  score threshold is (an untrained model's masks are ties nearly everywhere: 0.5 +- a little).
- **Keypoints**: each keypoint within KEYPOINT_TOLERANCE_PX of eager's, and its score within
  KEYPOINT_SCORE_TOLERANCE of eager's (relative to its size: a keypoint's score is the heatmap's maximum, unbounded).

Plain NumPy: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract.instances import MASK_THRESHOLD, paste_mask
from export.detection_parity import BOX_TOLERANCE_PX

MASK_DISAGREEMENT = 0.02
MASK_TIE = 0.01
EDGE_PX = 2  # a matched box within 1 px, and the paste's rounding to whole pixels
KEYPOINT_TOLERANCE_PX = BOX_TOLERANCE_PX
KEYPOINT_SCORE_TOLERANCE = 1e-3


@dataclass
class InstanceGaps:
    """The worst gaps over every matched pair so far, and the first failure, said in a line."""

    masks: int = 0  # pairs compared
    worst_mask: float = 0.0  # the largest share of disagreeing pixels
    mask_pixels: int = 0  # pixels either side claims, ties included
    tie_pixels: int = 0  # of those, ties
    keypoints: int = 0
    worst_keypoint_px: float = 0.0
    worst_keypoint_score: float = 0.0
    reason: str | None = None

    def add(
        self,
        eager: dict[str, np.ndarray],
        graph: dict[str, np.ndarray],
        pairs: tuple[tuple[int, int], ...],
        where: str,
    ) -> None:
        """Compare one image's matched pairs: `eager` and `graph` are its outputs without the batch dimension
        (eager's masks pasted D x H x W, the graph's M x M)."""
        for i, j in pairs:
            if "masks" in eager:
                self._mask(eager["masks"][i], graph["masks"][j], graph["boxes"][j], f"{where}, detection {i}")
            if "keypoints" in eager:
                self._keypoints(eager["keypoints"][i], graph["keypoints"][j], f"{where}, detection {i}")

    def _mask(self, eager: np.ndarray, small: np.ndarray, box: np.ndarray, where: str) -> None:
        height, width = eager.shape
        ours = paste_mask(small, box, height, width) > MASK_THRESHOLD
        theirs = eager > MASK_THRESHOLD
        decided = np.abs(eager - MASK_THRESHOLD) > MASK_TIE
        either = int(((ours | theirs) & decided).sum())
        self.mask_pixels += int((ours | theirs).sum())
        self.tie_pixels += int(((ours | theirs) & ~decided).sum())
        apart = (ours ^ theirs) & decided & ~_near_edge(theirs, EDGE_PX)
        share = float(apart.sum() / either) if either else 0.0
        self.masks += 1
        self.worst_mask = max(self.worst_mask, share)
        if share > MASK_DISAGREEMENT and self.reason is None:
            allowed = f"{MASK_DISAGREEMENT:.0%}"
            self.reason = f"{where}: the masks disagree on {share:.1%} of their pixels (at most {allowed})"

    def _keypoints(self, eager: np.ndarray, graph: np.ndarray, where: str) -> None:
        gap_px = float(np.abs(eager[:, :2] - graph[:, :2]).max(initial=0.0))
        gap_score = float((np.abs(eager[:, 2] - graph[:, 2]) / np.maximum(1.0, np.abs(eager[:, 2]))).max(initial=0.0))
        self.keypoints += 1
        self.worst_keypoint_px = max(self.worst_keypoint_px, gap_px)
        self.worst_keypoint_score = max(self.worst_keypoint_score, gap_score)
        if self.reason is None and (gap_px > KEYPOINT_TOLERANCE_PX or gap_score > KEYPOINT_SCORE_TOLERANCE):
            self.reason = f"{where}: a keypoint {gap_px:.2f} px from eager's, its score {gap_score:.1e} apart"

    def line(self) -> str | None:
        """The report's line, or None for a detector with neither."""
        parts = []
        if self.masks:
            parts.append(
                f"masks of {self.masks} matched detections, pasted as served: at most {self.worst_mask:.2%} of "
                f"their pixels disagree (allowed {MASK_DISAGREEMENT:.0%}; ties within {MASK_TIE:g} of 0.5 aside: "
                f"{self.tie_pixels / max(self.mask_pixels, 1):.1%} of them)"
            )
        if self.keypoints:
            parts.append(
                f"keypoints of {self.keypoints} matched detections: within {self.worst_keypoint_px:.2e} px "
                f"(allowed {KEYPOINT_TOLERANCE_PX:g}), scores within {self.worst_keypoint_score:.1e} relative"
            )
        return "; ".join(parts) or None


def _near_edge(mask: np.ndarray, reach: int) -> np.ndarray:
    """The pixels within `reach` steps (4-neighbours) of the edge of `mask`, inside or out."""
    grown, shrunk = mask.copy(), mask.copy()
    for _ in range(reach):
        grown = _neighbours(grown, np.logical_or, False)
        shrunk = _neighbours(shrunk, np.logical_and, True)
    return grown & ~shrunk


def _neighbours(mask: np.ndarray, combine: np.ufunc, outside: bool) -> np.ndarray:
    padded = np.pad(mask, 1, constant_values=outside)
    out = padded[1:-1, 1:-1].copy()
    for view in (padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]):
        combine(out, view, out=out)
    return out
