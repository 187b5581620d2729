"""A Hugging Face text classifier (`*ForSequenceClassification`, a Trainer checkpoint or a save_pretrained folder;
with --hf-config, a DDP state_dict, an Accelerate or a DCP folder), exported with its tokenizer: texts in, `logits`
out, its labels from the config's `id2label`. Where its tokenizer encodes pairs, it takes a single text and a pair
of texts (NLI, paraphrase) alike, as transformers' text-classification pipeline does for any sequence classifier,
and parity proves both; --text-pairs exports one that reads only pairs (a single text is then refused).
export/hf_text.py builds it, proves it on real texts and checks the tokenizer; without a tokenizer anywhere it is
exported as a model of token ids.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from contract.manifest import Manifest
from contract.signature import TASK_TEXT_CLASSIFICATION
from export.hf_text import (
    LoadedText,
    Logits,
    config_labels,
    hf_manifest,
    load_hf_text,
    pipeline_scores,
    tokenized_job,
    training_tokenizer,
)
from export.job import Job, log_loading
from export.pipeline import ExportRequest, ExportTask, tolerance_of, write_tensor_export
from export.readers.hf_checkpoint import HfCheckpoint
from export.reference import pipeline_reference
from export.tensor_model import Example, describe

log = logging.getLogger("export")


def text_job(request: ExportRequest) -> Job:
    options, hf = request.options, request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    loaded = load_hf_text(request, hf, "AutoModelForSequenceClassification")
    tokenizer = training_tokenizer(request, hf, loaded, None)
    if tokenizer is None:
        if options.read.text_pairs:
            raise ValueError(f"--text-pairs: no tokenizer beside {hf.config_dir} to join the pairs; --tokenizer DIR")
        return _token_ids_job(request, hf, loaded)
    labels, scores = config_labels(hf, loaded.model.config), pipeline_scores(loaded.model.config)
    reference = pipeline_reference(hf, loaded, tokenizer, tolerance_of(options), scores)
    fields: Manifest = {"task": TASK_TEXT_CLASSIFICATION, "labels": labels, "scores": scores}
    fields["reference"] = reference.to_manifest()
    described = f"{hf.architecture} ({len(labels)} labels: {', '.join(labels[:4])}) with its tokenizer"
    takes_pairs = not options.read.text_pairs and encodes_pairs(tokenizer)
    if options.read.text_pairs:
        described += ", on pairs of texts"
    elif takes_pairs:
        described += ", on a text or a pair of texts"
    wrapper = Logits(loaded.model)
    return tokenized_job(
        request,
        hf,
        loaded,
        tokenizer,
        wrapper,
        fields,
        described,
        options.read.text_pairs,
        reference.checks,
        takes_pairs,
    )


def encodes_pairs(tokenizer: Any) -> bool:
    """Whether `tokenizer` encodes a pair of texts (transformers' text-classification pipeline then takes pairs for
    any sequence classifier): a post-processor that joins two texts, as BERT's, RoBERTa's or DeBERTa's does."""
    backend = tokenizer.backend_tokenizer
    return backend.post_processor is not None and backend.num_special_tokens_to_add(True) > 0


def _token_ids_job(request: ExportRequest, hf: HfCheckpoint, loaded: LoadedText) -> Job:
    """No tokenizer anywhere: the model exported as any model is (`task` tensors), taking token ids. Its example is
    two rows of ids inside the vocabulary, the second padded (parity runs on them; nothing is tokenized)."""
    log.warning(
        "no tokenizer beside %s (tokenizer.json or tokenizer_config.json; --tokenizer DIR names one): exported as a "
        "model that takes token ids, served on /predict and the protocol, not on /classify",
        hf.config_dir,
    )
    vocabulary, length = int(loaded.model.config.vocab_size), 8
    ids = (torch.arange(2 * length).reshape(2, length) * 7919 % (vocabulary - 1) + 1).long()
    mask = torch.ones_like(ids)
    mask[1, length // 2 :] = 0
    example = Example({"input_ids": ids, "attention_mask": mask}, keywords=True)
    dynamic: dict[str, tuple[int, ...]] = {"input_ids": (1,), "attention_mask": (1,)}
    signature, wrapped = describe(Logits(loaded.model), example, dynamic)
    log_loading(loaded.src, loaded.unwrapped)
    manifest = hf_manifest(hf, signature, dynamic, loaded.src, loaded.unwrapped, loaded.provenance, request.timings)
    tol, formats, device = tolerance_of(request.options), request.options.write.formats, request.device
    return Job(
        manifest,
        lambda out: write_tensor_export(wrapped, example, dynamic, formats, device, tol, manifest, out),
        f"{hf.architecture} (no tokenizer: inputs input_ids, attention_mask; outputs logits)",
    )


TASK = ExportTask(TASK_TEXT_CLASSIFICATION, "Hugging Face text classifiers", text_job, frozenset({"text_pairs"}))
