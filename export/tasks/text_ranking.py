"""A Hugging Face cross-encoder (a reranker): a `*ForSequenceClassification` with one label, trained on pairs of
texts (a query and a passage), as sentence-transformers' CrossEncoder and Trainer with `num_labels=1` write it.
Exported as a text classifier is (export/hf_text.py), on pairs: its tokenizer must join two texts, parity and the
tokenizer's checks run on pairs (short and long on either side, both past the maximum), and the manifest's
`text-ranking` task serves it on /rerank (serve/tasks/text_ranking.py).
"""

from __future__ import annotations

from contract.manifest import Manifest
from contract.signature import TASK_TEXT_RANKING
from export.hf_text import Logits, config_labels, load_hf_text, pipeline_scores, tokenized_job, training_tokenizer
from export.job import Job
from export.pipeline import ExportRequest, ExportTask, tolerance_of
from export.readers.hf_checkpoint import CONFIG, HfCheckpoint
from export.reference import cross_encoder_reference

# sentence-transformers' CrossEncoder activations, as its config.json names them, and the manifest's word for each
ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "none",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.Identity": "none",
}


def ranking_job(request: ExportRequest) -> Job:
    options, hf = request.options, request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    loaded = load_hf_text(request, hf, "AutoModelForSequenceClassification")
    tokenizer = training_tokenizer(request, hf, loaded, "cross-encoder")
    if tokenizer.num_special_tokens_to_add(pair=True) <= tokenizer.num_special_tokens_to_add(pair=False):
        raise ValueError(
            f"{hf.config_dir}: the tokenizer has no template for a pair of texts (its post-processor joins one "
            "text only), and a one-logit classifier is served as a cross-encoder of pairs"
        )
    config = loaded.model.config
    scores, rerank_scores = pipeline_scores(config), cross_encoder_scores(hf)
    reference = cross_encoder_reference(hf, loaded, tokenizer, tolerance_of(options), scores, rerank_scores)
    fields: Manifest = {"task": TASK_TEXT_RANKING, "labels": config_labels(hf, config), "scores": scores}
    fields |= {"rerank_scores": rerank_scores, "reference": reference.to_manifest()}
    described = f"{hf.architecture} (a cross-encoder: one score per pair of texts) with its tokenizer"
    wrapper = Logits(loaded.model)
    return tokenized_job(request, hf, loaded, tokenizer, wrapper, fields, described, True, reference.checks)


def cross_encoder_scores(hf: HfCheckpoint) -> str:
    """How sentence-transformers' CrossEncoder scores this model's logit, which /rerank answers: the activation its
    config.json names (`sentence_transformers.activation_fn`, or before 4.0 `sbert_ce_default_activation_function`),
    the sigmoid where none is named; ValueError for one handoff does not apply."""
    own = hf.config.get("sentence_transformers") or {}
    named = own.get("activation_fn") if isinstance(own, dict) else None
    named = named or hf.config.get("sbert_ce_default_activation_function")
    if named is None:
        return "sigmoid"
    if named not in ACTIVATIONS:
        raise ValueError(
            f"{hf.config_dir / CONFIG}: the CrossEncoder's activation {named!r}; handoff applies "
            f"{' or '.join(ACTIVATIONS)}"
        )
    return ACTIVATIONS[named]


TASK = ExportTask(TASK_TEXT_RANKING, "Hugging Face cross-encoders", ranking_job, frozenset({"text_pairs"}))
