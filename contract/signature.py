"""The model's signature: the names, dtypes and shapes of what it takes and what it gives.

Written into the manifest by export (`signature`, beside `task`) and read by everything that describes or
checks a request: the service's /info, the Open Inference Protocol's metadata and config, its infer checks.
Shapes use -1 for a dynamic dimension; dimension 0 of every tensor is the batch. Plain Python: the serving
path imports this and must not need torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TASK_IMAGE_CLASSIFICATION = "image-classification"
TASK_TENSORS = "tensors"
TASK_TEXT_CLASSIFICATION = "text-classification"  # a Hugging Face classifier with its tokenizer
TASK_TEXT_RANKING = "text-ranking"  # a Hugging Face cross-encoder (one logit, pairs of texts): a query's texts ranked
TASK_TOKEN_CLASSIFICATION = "token-classification"  # a Hugging Face token classifier: a text in, its entities out
TASK_TEXT_EMBEDDING = "text-embedding"  # a Hugging Face encoder with its pooling: a text in, a vector out
TASK_TEXT_GENERATION = "text-generation"  # a Hugging Face causal language model: prompts in, generated text out
TASK_OBJECT_DETECTION = "object-detection"  # a torchvision detector: an image in, boxes, scores and labels out
TASK_IMAGE_TEXT = "image-text"  # CLIP, SigLIP: image and text embeddings, zero-shot image classification
TASK_SPEECH_RECOGNITION = "speech-recognition"  # a Hugging Face Whisper: an audio file in, its text out
TASK_AUDIO_CLASSIFICATION = "audio-classification"  # a Hugging Face audio classifier: an audio file in, its classes out
TASK_SEMANTIC_SEGMENTATION = "semantic-segmentation"  # a torchvision segmenter: an image in, a class per pixel out
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    """one of DTYPES (NumPy's names)"""
    shape: tuple[int, ...]
    """-1 for a dynamic dimension; shape[0] is the batch (always -1)"""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> TensorSpec:
        name, dtype, shape = entry.get("name"), entry.get("dtype"), entry.get("shape")
        if not isinstance(name, str) or not name:
            raise ValueError(f"signature entry {entry!r}: needs a non-empty name")
        if dtype not in DTYPES:
            raise ValueError(f"signature entry {name!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if (
            not isinstance(shape, list)
            or not shape
            or shape[0] != -1
            or not all(isinstance(d, int) and (d == -1 or d > 0) for d in shape)
        ):
            raise ValueError(f"signature entry {name!r}: shape {shape!r} must start with -1 (the batch)")
        return cls(name, dtype, tuple(shape))


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs]}

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> Signature:
        try:
            inputs = tuple(TensorSpec.from_dict(t) for t in entry["inputs"])
            outputs = tuple(TensorSpec.from_dict(t) for t in entry["outputs"])
        except (KeyError, TypeError, AttributeError):
            raise ValueError("signature: expected {'inputs': [...], 'outputs': [...]}") from None
        names = [t.name for t in inputs] + [t.name for t in outputs]
        if not inputs or not outputs or len(set(names)) != len(names):
            raise ValueError(f"signature: needs inputs and outputs with distinct names, got {names}")
        return cls(inputs, outputs)


def classifier_signature(input_shape: list[int], num_classes: int, dtype: str = "float32") -> Signature:
    """An image classifier's: `input` N x C x H x W in, `logits` N x classes out."""
    return Signature(
        (TensorSpec("input", dtype, tuple(input_shape)),),
        (TensorSpec("logits", "float32", (-1, num_classes)),),
    )


def read_signature(manifest: Mapping[str, Any]) -> Signature:
    """The manifest's signature; a classifier export from before signatures existed gets its derived one."""
    if "signature" in manifest:
        return Signature.from_dict(manifest["signature"])
    return classifier_signature(manifest["input"]["shape"], manifest["num_classes"], manifest["input"]["dtype"])


def read_task(manifest: Mapping[str, Any]) -> str:
    return str(manifest.get("task", TASK_IMAGE_CLASSIFICATION))
