"""Sentence embeddings: a Hugging Face encoder (`*Model`: BertModel, RobertaModel, ... as Trainer's checkpoint or a
save_pretrained folder, or with --hf-config any other layout) or a sentence-transformers folder, exported with its
pooling and normalisation inside the graph: token ids in, one vector per text out (`embeddings`).

A sentence-transformers folder (2.x to 6.x) is read as `SentenceTransformer(folder)` reads it
(export/readers/sentence_transformers.py): its pooling, its Normalize module, its `max_seq_length` and its prompts,
everything else that would change a vector refused. Its reference is the library's own call: the export, run as the
service runs it (the default prompt and each named one put before the texts, the served tokenizer, the ONNX model),
equals `SentenceTransformer(folder).encode(texts, prompt_name=...)` on the parity texts, past the length limit too.
A plain encoder is pooled as sentence-transformers pools by default, the mean over the attention mask, and
normalised, as text-embeddings-inference and OpenAI answer by default; no library call pools it, so its reference
is handoff's model, and the manifest's `reference` says so. The manifest's `embedding` says what is served
(`pooling`, `normalized`, `dimensions`, `prompts`, `default_prompt_name`). Parity and the tokenizer's checks are every
text model's (export/hf_text.py): the padded batch's vectors equal each text's alone, so texts of any length share a
call.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from contract.manifest import Manifest
from contract.prompts import Prompts
from contract.signature import TASK_TEXT_EMBEDDING
from contract.tokenizer_spec import TextTokenizer
from export.hf_text import SHORTEST, load_hf_text, tokenized_job, training_tokenizer
from export.hf_tokenizer import SENTENCES
from export.job import Job
from export.parity import Tolerance
from export.pipeline import Check, ExportRequest, ExportTask, tolerance_of
from export.readers.hf_checkpoint import HfCheckpoint
from export.readers.sentence_transformers import SentenceTransformersFolder, read_sentence_transformers
from export.reference import Reference, ServedModel, folder_is_the_model


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


def without_unused_pooler(model: nn.Module, keys: set[str]) -> None:
    """BERT-style encoders build a pooler (a dense layer on the first token) that embeddings never use; an encoder
    trained without one (`add_pooling_layer=False`) has no weights for it, so it is left out rather than refused."""
    if getattr(model, "pooler", None) is not None and not any(key.startswith("pooler.") for key in keys):
        model.pooler = None  # type: ignore[assignment]


def embedding_job(request: ExportRequest) -> Job:
    hf = request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    loaded = load_hf_text(request, hf, "AutoModel", without_unused_pooler)
    dimensions = int(loaded.model.config.hidden_size)
    found = read_sentence_transformers(hf.config_dir, dimensions)
    reference = library_reference(request, hf, found)
    tokenizer = training_tokenizer(request, hf, loaded, "sentence encoder")
    if found is not None and found.max_seq_length is not None:
        tokenizer.model_max_length = found.max_seq_length  # as sentence-transformers sets it on loading
    pooling, normalize = (found.pooling, found.normalize) if found is not None else ("mean", True)
    prompts = found.prompts if found is not None else Prompts()
    embedding: dict[str, Any] = {"pooling": pooling, "normalized": normalize, "dimensions": dimensions}
    embedding |= prompts.to_manifest()
    fields: Manifest = {"task": TASK_TEXT_EMBEDDING, "embedding": embedding, "reference": reference.to_manifest()}
    if found is not None:
        fields["read"] = found.read
    layout = "a sentence-transformers folder" if found is not None else "an encoder"
    described = f"{hf.architecture} ({layout}: {dimensions} dimensions, {pooling} pooling) with its tokenizer"
    wrapper = Pooled(loaded.model, pooling, normalize)
    return tokenized_job(request, hf, loaded, tokenizer, wrapper, fields, described, reference=reference.checks)


def library_reference(request: ExportRequest, hf: HfCheckpoint, found: SentenceTransformersFolder | None) -> Reference:
    """sentence-transformers' `encode` on the folder for a sentence-transformers folder whose weights are its own;
    handoff's pooling otherwise (a plain encoder has no library call that pools it), said so in the manifest.
    ValueError where sentence-transformers is not installed, unless --own-reference accepts handoff's."""
    own = "transformers' AutoModel, pooled and normalised by handoff"
    if found is None:
        return Reference("handoff", own, why_not="no sentence-transformers folder: the pooling is handoff's default")
    if not folder_is_the_model(hf):
        why = "the weights are not the sentence-transformers folder's own (read from elsewhere, an adapter merged, or "
        why += "remote code)"
        return Reference("handoff", own, why_not=why)
    if importlib.util.find_spec("sentence_transformers") is None:
        if not request.options.parity.own_reference:
            raise ValueError(
                f"{hf.config_dir}: a sentence-transformers folder, whose answers are sentence-transformers' "
                "encode(): pip install sentence-transformers, or --own-reference to compare with handoff's own model"
            )
        return Reference("handoff", own, why_not="sentence-transformers is not installed (--own-reference)")
    tol = tolerance_of(request.options)
    call = "SentenceTransformer(folder, device='cpu').encode(texts, prompt_name=...)"
    return Reference("sentence-transformers", call, lambda served, out: encode_matches(found, served, out, tol))


def encode_matches(found: SentenceTransformersFolder, served: TextTokenizer, out: Path, tol: Tolerance) -> list[Check]:
    """The export as the service runs it (each prompt put before the texts, the served tokenizer, the ONNX model)
    against `SentenceTransformer(folder).encode` on the parity texts, with every prompt the folder names and none."""
    from sentence_transformers import SentenceTransformer

    library = SentenceTransformer(str(found.folder), device="cpu", local_files_only=True, trust_remote_code=False)
    texts = [SHORTEST, *SENTENCES, " ".join(SENTENCES * (served.settings.max_length // 8 + 1))]
    model = ServedModel(out)
    worst, where = 0.0, ""
    for name in [None, *found.prompts.named]:
        ours = model(served.encode([found.prompts.prefix(name) + text for text in texts]).rows)
        theirs = library.encode(texts, prompt_name=name, convert_to_numpy=True, batch_size=len(texts))
        gap = float(np.abs(ours - theirs).max()) if ours.shape == theirs.shape else float("inf")
        if gap > worst:
            worst, where = gap, f"prompt {name!r}" if name is not None else f"prompt {found.prompts.default!r}"
    failed = worst > tol.atol + tol.rtol * 1.0
    reason = f"the served vectors differ from encode()'s by {worst:.2e} ({where})" if failed else None
    return [("sentence-transformers encode", reason)]


TASK = ExportTask(TASK_TEXT_EMBEDDING, "sentence encoders", embedding_job, frozenset({"own_reference"}))
