"""Sentence embeddings: a Hugging Face encoder (`*Model`: BertModel, RobertaModel, ... as Trainer's checkpoint or a
save_pretrained folder, or with --hf-config any other layout) or a sentence-transformers folder, exported with its
pooling and normalisation inside the graph: token ids in, one vector per text out (`embeddings`).

Pooling is what the sentence-transformers folder says (`1_Pooling/config.json`: the mean over the text's tokens,
or its first token's, CLS), and the vectors are normalised to unit length where its `modules.json` lists a
Normalize module. A plain encoder is pooled as sentence-transformers pools by default, the mean over the attention
mask, and normalised, as text-embeddings-inference and OpenAI answer by default. The manifest's `embedding` says
which (`pooling`, `normalized`, `dimensions`). Parity and the tokenizer's checks are every text model's
(export/hf_text.py): the padded batch's vectors equal each text's alone, so texts of any length share a call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from contract.signature import TASK_TEXT_EMBEDDING
from export.hf_text import load_hf_text, tokenized_job, training_tokenizer
from export.job import Job
from export.pipeline import ExportRequest, ExportTask, refuse_classifier_flags
from export.readers.hf_checkpoint import HfCheckpoint, check_own_files

MODULES = "modules.json"  # a sentence-transformers folder's modules, in order
POOLING = "1_Pooling/config.json"
POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
NORMALIZE = "sentence_transformers.models.Normalize"


class Pooled(nn.Module):
    """An encoder called with token inputs by name, giving each text's vector: its tokens' hidden states pooled
    (`mean` over the attention mask, or `cls`, the first token's), normalised to unit length if `normalize`."""

    def __init__(self, model: nn.Module, pooling: str, normalize: bool) -> None:
        super().__init__()
        self.model, self.pooling, self.normalize = model, pooling, normalize

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.model(**inputs, return_dict=True).last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return {"embeddings": F.normalize(pooled, p=2.0, dim=-1) if self.normalize else pooled}


def sentence_transformers_modules(folder: Path) -> tuple[str, bool] | None:
    """A sentence-transformers folder's (pooling, normalize), or None for a folder without modules.json; ValueError
    for modules or a pooling this export does not reproduce."""
    if not (folder / MODULES).is_file():
        return None
    check_own_files(folder, (MODULES, POOLING))
    try:
        modules = json.loads((folder / MODULES).read_text())
        pooling = json.loads((folder / POOLING).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{folder}: a sentence-transformers folder whose {MODULES} or {POOLING} cannot be read ({err})"
        ) from None
    if not isinstance(modules, list) or not isinstance(pooling, dict):
        raise ValueError(f"{folder}: {MODULES} must list the modules and {POOLING} hold the pooling's settings")
    kinds = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    known = {"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling", NORMALIZE}
    if set(kinds) - known:
        other = ", ".join(sorted(set(kinds) - known))
        raise ValueError(f"{folder / MODULES}: {other}: handoff reproduces Transformer, Pooling and Normalize only")
    modes = [mode for key, mode in POOLING_MODES.items() if pooling.get(key)]
    others = [key for key, value in pooling.items() if key.startswith("pooling_mode_") and value]
    if len(modes) != 1 or len(others) != 1:
        raise ValueError(
            f"{folder / POOLING}: pooling {', '.join(others) or '(none)'}; handoff reproduces one of "
            f"{', '.join(POOLING_MODES)}"
        )
    return modes[0], NORMALIZE in kinds


def without_unused_pooler(model: nn.Module, keys: set[str]) -> None:
    """BERT-style encoders build a pooler (a dense layer on the first token) that embeddings never use; an encoder
    trained without one (`add_pooling_layer=False`) has no weights for it, so it is left out rather than refused."""
    if getattr(model, "pooler", None) is not None and not any(key.startswith("pooler.") for key in keys):
        model.pooler = None  # type: ignore[assignment]


def embedding_job(request: ExportRequest) -> Job:
    args, hf = request.args, request.hf
    assert hf is not None  # TASK recognized it
    refuse_classifier_flags(args, "a Hugging Face sentence encoder")
    found = sentence_transformers_modules(hf.config_dir)
    pooling, normalize = found if found is not None else ("mean", True)
    loaded = load_hf_text(request, hf, "AutoModel", without_unused_pooler)
    tokenizer = training_tokenizer(request, hf, loaded, "sentence encoder")
    dimensions = int(loaded.model.config.hidden_size)
    embedding: dict[str, Any] = {"pooling": pooling, "normalized": normalize, "dimensions": dimensions}
    fields = {"task": TASK_TEXT_EMBEDDING, "embedding": embedding}
    layout = "a sentence-transformers folder" if found is not None else "an encoder"
    described = f"{hf.architecture} ({layout}: {dimensions} dimensions, {pooling} pooling) with its tokenizer"
    return tokenized_job(request, hf, loaded, tokenizer, Pooled(loaded.model, pooling, normalize), fields, described)


def is_encoder(request: ExportRequest) -> bool:
    """A Hugging Face checkpoint of a bare encoder (`BertModel`: no task head), or a sentence-transformers folder."""
    hf: HfCheckpoint | None = request.hf
    if hf is None:
        return False
    bare = hf.architecture.endswith("Model") and "For" not in hf.architecture
    return bare or (hf.config_dir / MODULES).is_file()


TASK = ExportTask(TASK_TEXT_EMBEDDING, is_encoder, embedding_job)
