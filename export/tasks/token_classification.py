"""A Hugging Face token classifier (`*ForTokenClassification`: named entities, parts of speech), exported with its
tokenizer: texts in, each token's `logits` out (N x tokens x labels), its labels from the config's `id2label`. It is
built, proved on real texts and its tokenizer checked as every text model's (export/hf_text.py), padding included:
each text's tokens answer in a padded batch as they do alone. The service groups the tokens into entities
(serve/tasks/token_classification.py).
"""

from __future__ import annotations

from contract.manifest import Manifest
from contract.signature import TASK_TOKEN_CLASSIFICATION
from export.hf_text import Logits, config_labels, load_hf_text, tokenized_job, training_tokenizer
from export.job import Job
from export.pipeline import ExportRequest, ExportTask, tolerance_of
from export.reference import token_pipeline_reference


def token_job(request: ExportRequest) -> Job:
    options, hf = request.options, request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    loaded = load_hf_text(request, hf, "AutoModelForTokenClassification")
    tokenizer = training_tokenizer(request, hf, loaded, "token classifier")
    labels = config_labels(hf, loaded.model.config)
    reference = token_pipeline_reference(hf, loaded, tokenizer, tolerance_of(options))
    fields: Manifest = {"task": TASK_TOKEN_CLASSIFICATION, "labels": labels, "reference": reference.to_manifest()}
    described = f"{hf.architecture} ({len(labels)} token labels: {', '.join(labels[:4])}) with its tokenizer"
    wrapper = Logits(loaded.model)
    return tokenized_job(request, hf, loaded, tokenizer, wrapper, fields, described, reference=reference.checks)


TASK = ExportTask(TASK_TOKEN_CLASSIFICATION, "Hugging Face token classifiers", token_job)
