"""A Hugging Face token classifier (`*ForTokenClassification`: named entities, parts of speech), exported with its
tokenizer: texts in, each token's `logits` out (N x tokens x labels), its labels from the config's `id2label`. It is
built, proved on real texts and its tokenizer checked as every text model's (export/hf_text.py), padding included:
each text's tokens answer in a padded batch as they do alone. The service groups the tokens into entities
(serve/tasks/token_classification.py).
"""

from __future__ import annotations

from contract.signature import TASK_TOKEN_CLASSIFICATION
from export.hf_text import Logits, load_hf_text, load_tokenizer, tokenized_job
from export.job import Job
from export.pipeline import ExportRequest, ExportTask, refuse_classifier_flags
from export.readers.hf_checkpoint import CONFIG, tokenizer_folder
from train.class_names import check_class_names


def token_job(request: ExportRequest) -> Job:
    args, hf = request.args, request.hf
    assert hf is not None  # TASK recognized it
    refuse_classifier_flags(args, "a Hugging Face token classifier")
    loaded = load_hf_text(request, hf, "AutoModelForTokenClassification")
    folder = tokenizer_folder(hf, args.tokenizer)
    if folder is None:
        raise ValueError(
            f"{hf.config_dir}: no tokenizer beside the token classifier (tokenizer.json or tokenizer_config.json); "
            "its entities are found in texts: --tokenizer DIR names its tokenizer"
        )
    tokenizer = load_tokenizer(folder, args.trust_remote_code, int(loaded.model.config.vocab_size))
    config = loaded.model.config
    names = [config.id2label.get(i, i) for i in range(config.num_labels)]
    labels = check_class_names(names, f"{hf.config_dir / CONFIG}: id2label")
    fields = {"task": TASK_TOKEN_CLASSIFICATION, "labels": labels}
    described = f"{hf.architecture} ({len(labels)} token labels: {', '.join(labels[:4])}) with its tokenizer"
    return tokenized_job(request, hf, loaded, tokenizer, Logits(loaded.model), fields, described)


def is_token_classifier(request: ExportRequest) -> bool:
    return request.hf is not None and request.hf.architecture.endswith("ForTokenClassification")


TASK = ExportTask(TASK_TOKEN_CLASSIFICATION, is_token_classifier, token_job)
