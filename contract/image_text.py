"""What an image-text model (CLIP, SigLIP) answers beyond its two towers' embeddings, torch-free, as transformers
computes it: the manifest's `image_text` settings, unit vectors, and zero-shot classification's scores.

An image-text export is two tensor exports, each a whole export of its own (`image/`: pixels in, `image_embeds` out;
`text/`: token ids in, `text_embeds` out), bound by the outer manifest, which hashes their manifests
(export/tasks/image_text.py). Zero-shot classification is the pipeline's: each candidate label put in the hypothesis
template, its text embedding's cosine with the image's, times the model's `logit_scale` (exponentiated) plus its
`logit_bias` (SigLIP), then a softmax over the labels (CLIP) or a sigmoid of each (SigLIP).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from contract.scores import SCORE_FUNCTIONS

HYPOTHESIS_TEMPLATE = "This is a photo of {}."  # transformers' zero-shot image classification's default


@dataclass(frozen=True)
class ImageTextSettings:
    """The manifest's `image_text`: how similarity becomes a zero-shot score."""

    logit_scale: float  # already exponentiated, as the model's forward applies it
    logit_bias: float  # 0 where the model has none (CLIP)
    scores: str  # "softmax" over the labels (CLIP) or "sigmoid" of each (SigLIP)
    hypothesis_template: str = HYPOTHESIS_TEMPLATE

    def to_manifest(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_manifest(cls, fields: dict[str, Any]) -> ImageTextSettings:
        return cls(
            float(fields["logit_scale"]),
            float(fields["logit_bias"]),
            str(fields["scores"]),
            str(fields.get("hypothesis_template", HYPOTHESIS_TEMPLATE)),
        )

    def zero_shot(self, image_embeds: np.ndarray, text_embeds: np.ndarray) -> np.ndarray:
        """Each image's score for each text (images x texts), as the pipeline scores its candidate labels."""
        logits = self.logit_scale * unit(image_embeds) @ unit(text_embeds).T + self.logit_bias
        return SCORE_FUNCTIONS[self.scores](logits.astype(np.float64))


def unit(embeds: np.ndarray) -> np.ndarray:
    """Each row scaled to length one, as the models normalise before their similarity."""
    norms = np.linalg.norm(embeds.astype(np.float64), axis=-1, keepdims=True)
    return (embeds / np.maximum(norms, 1e-12)).astype(np.float32)
