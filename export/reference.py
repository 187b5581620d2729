"""What an export's answers are compared with besides handoff's own model: the user's library, called on the
checkpoint's folder as a user of that folder calls it (sentence-transformers' `encode`, transformers' pipelines),
against the export run as the service runs it (the served tokenizer, the ONNX model, the served scores). The
manifest's `reference` records the library, its version and the call, or why handoff's own model had to stand in.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from contract.audio_features import AudioFeatures
from contract.image_text import ImageTextSettings
from contract.manifest import ReferenceSection
from contract.pil_transform import Preprocessor
from contract.scores import SCORE_FUNCTIONS
from contract.tokenizer_spec import TextTokenizer, TokenizerSettings
from export.hf_text import encode_samples, parity_samples
from export.hf_tokenizer import SENTENCES, SIGLIP_TEXT_LENGTH
from export.parity import Tolerance, onnx_sessions
from export.pipeline import Check
from export.readers.hf_checkpoint import HfCheckpoint


@dataclass(frozen=True)
class Reference:
    """What the export's answers are compared with besides handoff's own model: the user's library on the folder."""

    library: str
    call: str
    checks: Callable[..., list[Check]] | None = None  # the task's call: (served tokenizer or clips, export folder)
    why_not: str | None = None  # why the library's call could not be the reference

    def to_manifest(self) -> ReferenceSection:
        version = importlib.metadata.version(self.library) if self.library != "handoff" else None
        return {"library": self.library, "version": version, "call": self.call, "not_the_library": self.why_not}


PIPELINE_IGNORED_LABELS = ("O",)  # the token-classification pipeline's default ignore_labels


def folder_is_the_model(hf: HfCheckpoint) -> bool:
    """Whether the library can load the model from the folder itself: its weights are the folder's own, no adapter
    is merged into them, and no code of its own is needed (else the library runs on the model as handoff loaded it)."""
    return hf.weights == hf.config_dir and hf.adapter is None and "auto_map" not in hf.config


def _model_named(hf: HfCheckpoint) -> str:
    """What a pipeline runs on, in the manifest's words."""
    return "folder" if folder_is_the_model(hf) else "the checkpoint's model as loaded, tokenizer=its tokenizer"


def _pipeline(task: str, hf: HfCheckpoint, model: Any, tokenizer: Any = None, **options: Any) -> Any:
    """transformers' pipeline for `task` on the folder where it holds the model (folder_is_the_model), else on `model`
    as handoff loaded it, with its `tokenizer` (or the `feature_extractor` among `options`); on the CPU."""
    import transformers

    make: Any = transformers.pipeline  # typed by overloads on each task's literal name
    if folder_is_the_model(hf):
        options.pop("feature_extractor", None)  # the folder's own
        return make(task, model=str(hf.config_dir), device="cpu", **options)
    return make(task, model=model, tokenizer=tokenizer, device="cpu", **options)


class ServedModel:
    """The exported model as the service runs it on the CPU: token rows (the served tokenizer's) in, its first output
    out."""

    def __init__(self, out: Path) -> None:
        self.session = onnx_sessions(out / "model.onnx", torch.device("cpu"))[0][2]
        self.names = [i.name for i in self.session.get_inputs()]

    def __call__(self, rows: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(None, {n: rows[n] for n in self.names})[0]


def pipeline_reference(hf: HfCheckpoint, loaded: Any, tokenizer: Any, tol: Tolerance, scores: str) -> Reference:
    """transformers' text-classification pipeline on the folder (or, where the weights are not the folder's own, on
    the model handoff loaded and its tokenizer), against the export as the service runs it: raw logits, and the
    scores the pipeline gives by default against the manifest's `scores` of the served logits."""
    where = _model_named(hf)
    call = f"pipeline('text-classification', model={where}, top_k=None)(text or {{text, text_pair}}, truncation=True)"

    def checks(served: TextTokenizer, out: Path) -> list[Check]:
        pipe = _pipeline("text-classification", hf, loaded.model, tokenizer=tokenizer, top_k=None)
        samples = parity_samples(served.settings)
        logits = ServedModel(out)(encode_samples(served, samples).rows)
        labels: Any = pipe.model.config.id2label
        worst, where_worst = 0.0, ""
        for sample, row in zip(samples, logits, strict=True):
            given: Any = sample[0] if len(sample) == 1 else {"text": sample[0], "text_pair": sample[1]}
            asked = {"truncation": True, "max_length": served.settings.max_length}
            raw = _by_label(pipe(given, function_to_apply="none", **asked))
            scored = _by_label(pipe(given, **asked))
            ours = SCORE_FUNCTIONS[scores](row)
            for i in range(len(row)):
                gap = max(abs(raw[labels[i]] - float(row[i])), abs(scored[labels[i]] - float(ours[i])))
                if gap > worst:
                    worst, where_worst = gap, " / ".join(text[:30] for text in sample)
        failed = worst > tol.atol + tol.rtol * float(np.abs(logits).max())
        reason = f"the served answer differs from the pipeline's by {worst:.2e} ({where_worst!r})" if failed else None
        return [("transformers pipeline", reason)]

    return Reference("transformers", call, checks)


def _by_label(answer: Any) -> dict[str, float]:
    """A pipeline's answer for one input (a text's comes back in a list of its own, a pair's not) by label."""
    found = answer[0] if answer and isinstance(answer[0], list) else answer
    return {p["label"]: float(p["score"]) for p in found}


def cross_encoder_reference(
    hf: HfCheckpoint, loaded: Any, tokenizer: Any, tol: Tolerance, scores: str, rerank_scores: str
) -> Reference:
    """sentence-transformers' `CrossEncoder(folder).predict(pairs)` (its activation as the folder's config.json sets
    it) against /rerank's scores (`rerank_scores` of the served logits) and raw scores; the text-classification
    pipeline against /classify's where sentence-transformers is not installed or the weights are not the folder's."""
    if not folder_is_the_model(hf) or importlib.util.find_spec("sentence_transformers") is None:
        return pipeline_reference(hf, loaded, tokenizer, tol, scores)
    call = "CrossEncoder(folder, device='cpu').predict(pairs), and with activation_fn=Identity() for raw scores"

    def checks(served: TextTokenizer, out: Path) -> list[Check]:
        from sentence_transformers import CrossEncoder

        library = CrossEncoder(str(hf.config_dir), device="cpu", local_files_only=True, trust_remote_code=False)
        samples = parity_samples(served.settings)
        logits = ServedModel(out)(encode_samples(served, samples).rows)[:, 0]
        pairs = [(a, b) for a, b in samples]
        theirs = library.predict(pairs, batch_size=len(pairs), convert_to_numpy=True)
        raw = library.predict(pairs, batch_size=len(pairs), activation_fn=torch.nn.Identity(), convert_to_numpy=True)
        ours = SCORE_FUNCTIONS[rerank_scores](logits)
        worst = max(float(np.abs(raw - logits).max()), float(np.abs(theirs - ours).max()))
        failed = worst > tol.atol + tol.rtol * float(np.abs(logits).max())
        reason = f"/rerank's scores differ from CrossEncoder.predict's by {worst:.2e}" if failed else None
        return [("sentence-transformers CrossEncoder", reason)]

    return Reference("sentence-transformers", call, checks)


def token_pipeline_reference(hf: HfCheckpoint, loaded: Any, tokenizer: Any, tol: Tolerance) -> Reference:
    """transformers' token-classification pipeline (`aggregation_strategy="none"`: each token's label and score) on
    the folder, or on the model as loaded, against the export as the service runs it: each text's tokens, their
    labels and softmax scores, the tokens the pipeline leaves out (special ones, `O`) left out alike."""
    call = f"pipeline('token-classification', model={_model_named(hf)}, aggregation_strategy='none')(text)"

    def checks(served: TextTokenizer, out: Path) -> list[Check]:
        pipe = _pipeline("token-classification", hf, loaded.model, tokenizer=tokenizer)
        labels: Any = pipe.model.config.id2label
        texts = [sample[0] for sample in parity_samples(served.settings)]
        encoded = served.encode(texts)
        scores = SCORE_FUNCTIONS["softmax"](ServedModel(out)(encoded.rows))
        for text, row, spans in zip(texts, scores, encoded.spans, strict=True):
            theirs = {
                int(t["index"]): (t["entity"], float(t["score"])) for t in pipe(text, aggregation_strategy="none")
            }
            best = [labels[int(token.argmax())] for token in row]
            ours = {
                i: (best[i], float(row[i].max()))
                for i, span in enumerate(spans)
                if span is not None and best[i] not in PIPELINE_IGNORED_LABELS
            }
            if set(ours) != set(theirs) or any(ours[i][0] != theirs[i][0] for i in ours):
                return [
                    ("transformers pipeline", f"the served tokens' labels differ from the pipeline's for {text[:30]!r}")
                ]
            gap = max((abs(ours[i][1] - theirs[i][1]) for i in ours), default=0.0)
            if gap > tol.atol + tol.rtol:
                return [("transformers pipeline", f"a token's score differs from the pipeline's by {gap:.2e}")]
        return [("transformers pipeline", None)]

    return Reference("transformers", call, checks)


IMAGE_PIPELINE_CALL = (
    "pipeline('image-classification', model=folder, image_processor=AutoImageProcessor.from_pretrained(folder, "
    "backend='pil'))(image, top_k=every label)"
)


def image_pipeline_matches(
    hf: HfCheckpoint, model: Any, processor_folder: Path, preprocess: dict[str, Any], scores: str, tol: Tolerance
) -> Callable[[list[Image.Image], Path], list[Check]]:
    """transformers' image-classification pipeline (its processor's PIL backend, whose pixels the service's equal)
    on the folder, or on `model` as loaded, against the export as the service runs it: each image preprocessed as
    the service does, the ONNX model, the manifest's `scores`, label by label."""

    def checks(images: list[Image.Image], out: Path) -> list[Check]:
        import transformers

        processor = transformers.AutoImageProcessor.from_pretrained(
            processor_folder, backend="pil", local_files_only=True
        )
        source = str(hf.config_dir) if folder_is_the_model(hf) else model
        pipe = transformers.pipeline("image-classification", model=source, image_processor=processor, device="cpu")
        labels: Any = pipe.model.config.id2label
        served = Preprocessor.from_manifest(preprocess, max_pixels=1 << 40)
        rows = np.stack([served(image) for image in images]).astype(np.float32)
        ours = SCORE_FUNCTIONS[scores](ServedModel(out)({"input": rows}).astype(np.float64))
        worst = 0.0
        for image, row in zip(images, ours, strict=True):
            theirs = _by_label(pipe(image.convert("RGB"), top_k=len(row)))  # every label (None gives 5)
            worst = max(worst, max(abs(theirs[labels[i]] - float(row[i])) for i in range(len(row))))
        failed = worst > tol.atol + tol.rtol
        reason = f"the served scores differ from the pipeline's by {worst:.2e}" if failed else None
        return [("transformers pipeline", reason)]

    return checks


def audio_pipeline_reference(
    hf: HfCheckpoint, model: Any, extractor: Any, features: AudioFeatures, scores: str, tol: Tolerance
) -> Reference:
    """transformers' audio-classification pipeline on the folder (or on `model` as loaded, with its extractor) against
    the export as the service runs it: each clip's features computed as the service computes them
    (contract/audio_features.py), the ONNX model, the manifest's `scores`, label by label."""
    given = "{'raw': clip, 'sampling_rate': rate}"
    call = f"pipeline('audio-classification', model={_model_named(hf)})({given}, top_k=None)"

    def checks(clips: list[np.ndarray], out: Path) -> list[Check]:
        pipe = _pipeline("audio-classification", hf, model, feature_extractor=extractor)
        labels: Any = pipe.model.config.id2label
        served, worst = ServedModel(out), 0.0
        for clip in clips:
            theirs = _by_label(pipe({"raw": clip, "sampling_rate": features.sampling_rate}, top_k=None))
            ours = SCORE_FUNCTIONS[scores](served({"input_values": features(clip)[None]}).astype(np.float64))[0]
            worst = max(worst, max(abs(theirs[labels[i]] - float(ours[i])) for i in range(len(ours))))
        failed = worst > tol.atol + tol.rtol
        reason = f"the served scores differ from the pipeline's by {worst:.2e}" if failed else None
        return [("transformers pipeline", reason)]

    return Reference("transformers", call, checks)


ZERO_SHOT_LABELS = ("a cat", "a dog", "the digit seven", "a street at night", "a bowl of flowers")
ZERO_SHOT_PHOTOS = 4  # the zero-shot pipeline runs on this many of the parity photos, each against every label


def image_text_reference(
    hf: HfCheckpoint,
    model: Any,
    processor_folder: Path,
    preprocess: dict[str, Any],
    settings: ImageTextSettings,
    tol: Tolerance,
) -> Reference:
    """The library's own calls on the folder (or on `model` as loaded) against the two towers as the service runs
    them: `get_image_features` on the processor's pixels (its PIL backend, whose pixels the service's equal) against
    the image tower on the service's; `get_text_features` on the tokenizer's ids, padded as the zero-shot pipeline
    pads them, against the served tokenizer and text tower; and `pipeline("zero-shot-image-classification")`'s
    scores, its hypothesis template and label order, against contract/image_text.py's on the served embeddings."""
    call = (
        "AutoModel.from_pretrained(folder).get_image_features / get_text_features, and pipeline('zero-shot-image-"
        "classification', model=folder, image_processor=AutoImageProcessor.from_pretrained(folder, backend='pil'))"
        "(image, candidate_labels=labels)"
    )

    def checks(photos: list[Image.Image], out: Path) -> list[Check]:
        import transformers

        image_processor = transformers.AutoImageProcessor.from_pretrained(
            processor_folder, backend="pil", local_files_only=True
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(out / "text", local_files_only=True)
        library = (
            transformers.AutoModel.from_pretrained(hf.config_dir, local_files_only=True).eval()
            if folder_is_the_model(hf)
            else model
        )
        text_manifest = json.loads((out / "text" / "manifest.json").read_text())
        served_tokenizer = TextTokenizer(
            (out / "text" / "tokenizer.json").read_bytes(), TokenizerSettings.from_manifest(text_manifest["tokenizer"])
        )
        texts = [*SENTENCES, *(settings.hypothesis_template.format(label) for label in ZERO_SHOT_LABELS)]
        served_pixels = Preprocessor.from_manifest(preprocess, max_pixels=1 << 40)
        ours_images = ServedModel(out / "image")(
            {"pixel_values": np.stack([served_pixels(p) for p in photos]).astype(np.float32)}
        )
        ours_texts = ServedModel(out / "text")(served_tokenizer.encode(texts).rows)
        padding: dict[str, Any] = (
            {"padding": "max_length", "max_length": SIGLIP_TEXT_LENGTH, "truncation": True}
            if settings.scores == "sigmoid"
            else {"padding": True, "truncation": True}
        )
        with torch.inference_mode():
            pixels = image_processor([p.convert("RGB") for p in photos], return_tensors="pt")["pixel_values"]
            theirs_images = _features(library.get_image_features(pixel_values=pixels))
            theirs_texts = _features(library.get_text_features(**tokenizer(texts, return_tensors="pt", **padding)))
        found: list[Check] = []
        for name, ours, theirs in (("image", ours_images, theirs_images), ("text", ours_texts, theirs_texts)):
            gap = float(np.abs(ours - theirs).max())
            failed = gap > tol.atol + tol.rtol * float(np.abs(theirs).max())
            found.append((f"get_{name}_features", f"the served embeddings differ by {gap:.2e}" if failed else None))
        pipe = transformers.pipeline(
            "zero-shot-image-classification",
            model=str(hf.config_dir) if folder_is_the_model(hf) else library,
            tokenizer=tokenizer,
            image_processor=image_processor,
            device="cpu",
        )
        hypotheses = ours_texts[len(SENTENCES) :]
        worst = 0.0
        for index, photo in enumerate(photos[:ZERO_SHOT_PHOTOS]):
            theirs_scores = {
                a["label"]: a["score"] for a in pipe(photo.convert("RGB"), candidate_labels=list(ZERO_SHOT_LABELS))
            }
            ours_scores = settings.zero_shot(ours_images[index : index + 1], hypotheses)[0]
            worst = max(
                worst, *(abs(theirs_scores[label] - float(s)) for label, s in zip(ZERO_SHOT_LABELS, ours_scores))
            )
        failed = worst > tol.atol + tol.rtol
        found.append(("zero-shot pipeline", f"the served scores differ by {worst:.2e}" if failed else None))
        return found

    return Reference("transformers", call, checks)


def _features(answer: Any) -> np.ndarray:
    """A `get_*_features` answer as an array (transformers 5 returns the projection as the pooler output)."""
    return (answer if isinstance(answer, torch.Tensor) else answer.pooler_output).numpy()
