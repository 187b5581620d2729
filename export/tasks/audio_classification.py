"""A Hugging Face audio classifier, as transformers' audio-classification pipeline loads it
(`AutoModelForAudioClassification`: wav2vec2, HuBERT and WavLM's `*ForSequenceClassification`, the Audio Spectrogram
Transformer's `ASTForAudioClassification`), from Trainer's checkpoint-N or a save_pretrained folder (with
--hf-config, a DDP state_dict), exported with its feature extractor: the extractor's features in, `logits` out, its
labels from the config's `id2label`.

The service decodes the audio file, mixes and resamples it (contract/audio.py) and computes the extractor's features
in numpy (contract/audio_features.py); the export proves those features equal to the extractor's, and the served
scores equal to the pipeline's on the folder, on synthesised clips (export/audio.py). A waveform model takes clips
of any length, each run at its own; a spectrogram model a fixed number of frames, which requests share.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from contract.audio_features import FEATURE_TABLES
from contract.signature import TASK_AUDIO_CLASSIFICATION
from export.audio import (
    FEATURE_EXTRACTOR,
    features_check,
    features_of,
    load_extractor,
    parity_clips,
)
from export.hf_text import config_labels, hf_manifest, load_hf_text
from export.job import Job, log_loading
from export.pipeline import (
    Check,
    ExportRequest,
    ExportTask,
    OwnChecks,
    library_checks,
    tolerance_of,
    write_tensor_export,
)
from export.readers.hf_checkpoint import CONFIG, PROCESSOR_CONFIGS, HfCheckpoint, processor_folder
from export.reference import audio_pipeline_reference
from export.tensor_model import Example, describe

AUTO_CLASS = "AutoModelForAudioClassification"


class FeatureLogits(nn.Module):
    """A transformers audio classifier called with its extractor's features, giving its logits alone."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_values: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.model(input_values=input_values, return_dict=True).logits}


def is_audio_classifier(hf: HfCheckpoint) -> bool:
    """Whether transformers' audio-classification pipeline loads this architecture for the config's model type (a
    wav2vec2 classifier is a `*ForSequenceClassification`, as a text classifier is)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES

    return MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES.get(str(hf.config.get("model_type"))) == hf.architecture


def audio_scores(config: object) -> str:
    """How the audio-classification pipeline scores the logits (it has no single-label sigmoid, unlike text's)."""
    problem = getattr(config, "problem_type", None)
    return {"regression": "none", "multi_label_classification": "sigmoid"}.get(str(problem), "softmax")


def audio_job(request: ExportRequest) -> Job:
    options, hf = request.options, request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    folder = processor_folder(hf, FEATURE_EXTRACTOR)
    extractor = load_extractor(folder, options.read.trust_remote_code)
    try:
        features = features_of(extractor)
    except ValueError as err:
        raise ValueError(f"{folder}: {err}") from None
    loaded = load_hf_text(request, hf, AUTO_CLASS)
    labels, scores = config_labels(hf, loaded.model.config), audio_scores(loaded.model.config)
    if scores == "none":
        raise ValueError(f"{hf.config_dir}: a regression head (problem_type regression); handoff serves classifiers")
    clips = parity_clips(features.sampling_rate)
    shortest = min(len(clip) for clip in clips)
    # a waveform model's rows share one length (each request runs at its own); a spectrogram's are all one shape
    rows = np.stack([features(clip[:shortest] if not features.row_shape else clip) for clip in clips])
    example = Example({"input_values": torch.from_numpy(rows)}, keywords=True)
    dynamic: dict[str, tuple[int, ...]] = {"input_values": () if features.row_shape else (1,)}
    signature, wrapped = describe(FeatureLogits(loaded.model), example, dynamic)
    log_loading(loaded.src, loaded.unwrapped)
    manifest = hf_manifest(hf, signature, dynamic, loaded.src, loaded.unwrapped, loaded.provenance, request.timings)
    reference = audio_pipeline_reference(hf, loaded.model, extractor, features, scores, tolerance_of(options))
    manifest |= {"task": TASK_AUDIO_CLASSIFICATION, "labels": labels, "scores": scores}
    manifest["audio"] = features.to_manifest()
    manifest["reference"] = reference.to_manifest()
    manifest["hf"] = {"model_type": hf.config["model_type"], "architecture": hf.architecture, "config": CONFIG}
    tol = tolerance_of(options)

    def audio_checks(out: Path) -> tuple[list[str], list[Check]]:
        files = [name for name in PROCESSOR_CONFIGS if (folder / name).is_file()]
        for name in files:
            shutil.copyfile(folder / name, out / name)
        if features.row_shape:
            (out / FEATURE_TABLES).write_bytes(features.tables())
            files.append(FEATURE_TABLES)
        checks = [features_check(extractor, features, clips, tol)]
        assert reference.checks is not None
        return files, checks + library_checks(lambda: reference.checks(clips, out))  # type: ignore[misc]

    def write(out: Path) -> int:
        own = OwnChecks("audio", audio_checks)
        return write_tensor_export(
            wrapped, example, dynamic, options.write.formats, request.device, tol, manifest, out, own
        )

    kind = "waveform" if not features.row_shape else f"{' x '.join(map(str, features.row_shape))} filter banks"
    described = (
        f"{hf.architecture} ({len(labels)} labels: {', '.join(labels[:4])}) with {type(extractor).__name__} "
        f"({features.sampling_rate} Hz, {kind})"
    )
    return Job(manifest, write, described)


TASK = ExportTask(TASK_AUDIO_CLASSIFICATION, "Hugging Face audio classifiers", audio_job)
