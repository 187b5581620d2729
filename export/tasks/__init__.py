"""The export tasks: one module each, found through one registry, in the spirit of Optimum's task table. Each task
supplies its model (rebuilt and loaded with provenance), its example inputs, its signature, its manifest fields and
its own checks; export/pipeline.py holds the steps they share and export/run.py the whole.

Which task a request is, decided once here (`task_for`): an example names the user's own model (tensors); an
open_clip checkpoint is an image-text model's (export/readers/open_clip.py); a Hugging
Face checkpoint goes by its architecture's suffix (`HF_HEADS`, one table: a head handoff does not serve yet is
refused there, naming it); a torchvision detector or segmenter by its architecture; anything else is an image
classifier. Then any task flag the task does not take is refused (`ExportTask.flags`). Adding a task: its module
here (a `TASK = ExportTask(...)`), one line in `TASKS` (and in `HF_HEADS` for a Hugging Face head), its module under
serve/tasks/, a docs page and its tests (docs/design.md, "Adding a task").
"""

from __future__ import annotations

from export.pipeline import ExportRequest, ExportTask, refuse_flags_not_for
from export.readers.hf_checkpoint import CONFIG, HfCheckpoint
from export.readers.sentence_transformers import MODULES
from export.tasks import (
    audio_classification,
    hf_image_classification,
    image_classification,
    image_text,
    object_detection,
    semantic_segmentation,
    speech_recognition,
    tensors,
    text_classification,
    text_embedding,
    text_generation,
    text_ranking,
    token_classification,
)

TASKS: tuple[ExportTask, ...] = (
    tensors.TASK,
    image_classification.TASK,
    object_detection.TASK,
    semantic_segmentation.TASK,
    hf_image_classification.TASK,
    text_classification.TASK,
    text_ranking.TASK,
    token_classification.TASK,
    text_embedding.TASK,
    text_generation.TASK,
    audio_classification.TASK,
    image_text.TASK,
    speech_recognition.TASK,
)

# A Hugging Face config's architecture, by the suffix of its name (the longest that matches), to the task that
# exports it; a string: a head people fine-tune that handoff does not export or serve yet, refused with its name.
HF_HEADS: dict[str, ExportTask | str] = {
    "ForSequenceClassification": text_classification.TASK,  # with one label: a cross-encoder (text_ranking)
    "ForTokenClassification": token_classification.TASK,
    "ForImageClassification": hf_image_classification.TASK,
    "ForCausalLM": text_generation.TASK,
    "LMHeadModel": text_generation.TASK,  # GPT-2's name for its causal head
    "Model": text_embedding.TASK,  # a bare encoder (BertModel): no task head
    "ForConditionalGeneration": "text generation (sequence to sequence)",
    "ForMaskedLM": "masked language modelling",
    "ForQuestionAnswering": "extractive question answering",
    "ForMultipleChoice": "multiple choice",
    "ForAudioClassification": audio_classification.TASK,  # and wav2vec2's, HuBERT's *ForSequenceClassification
    "ForCTC": "speech recognition",
    "ForSpeechSeq2Seq": "speech recognition",
}
# what works for any of them today: the model as the user builds it, given example inputs (docs/own-model.md)
ANY_MODEL = "--model module:factory --example inputs.pt exports it as a model of tensors"


def exported_heads() -> str:
    """The Hugging Face architectures handoff exports, for a refusal: "*ForSequenceClassification, ..."."""
    return ", ".join(f"*{suffix}" for suffix, task in HF_HEADS.items() if isinstance(task, ExportTask))


def hf_task(hf: HfCheckpoint) -> ExportTask:
    """The task of a Hugging Face checkpoint: a sentence-transformers folder is an encoder's, a one-label sequence
    classifier a cross-encoder's, else its head's (`HF_HEADS`); ValueError, in one line, for a head handoff does not
    export."""
    if (hf.config_dir / MODULES).is_file():
        return text_embedding.TASK
    if audio_classification.is_audio_classifier(hf):
        return audio_classification.TASK
    if speech_recognition.is_speech_recognizer(hf):  # WhisperForConditionalGeneration
        return speech_recognition.TASK
    if image_text.is_image_text(hf):  # CLIPModel, SiglipModel: a bare `*Model`, as an encoder's name is
        return image_text.TASK
    where = f"{hf.config_dir / CONFIG}: {hf.architecture or 'no architecture'}"
    suffixes = [suffix for suffix in HF_HEADS if hf.architecture.endswith(suffix)]
    if not suffixes:
        raise ValueError(f"{where}; handoff exports {exported_heads()}; {ANY_MODEL}")
    task = HF_HEADS[max(suffixes, key=len)]
    if isinstance(task, str):
        raise ValueError(
            f"{where} is {task}, which handoff does not export or serve yet; it exports {exported_heads()}; {ANY_MODEL}"
        )
    if task is text_classification.TASK and len(hf.config.get("id2label") or {0: 0, 1: 1}) == 1:
        return text_ranking.TASK  # one logit (transformers' default is two labels when the config lists none)
    return task


def task_for(request: ExportRequest) -> ExportTask:
    """The task that exports `request`; ValueError, in one line, for a checkpoint no task takes or a task flag the
    task does not take."""
    if request.options.read.example is not None:
        task = tensors.TASK
    elif request.open_clip is not None:
        task = image_text.TASK
    elif request.hf is not None:
        task = hf_task(request.hf)
    elif object_detection.is_detector(request.arch):
        task = object_detection.TASK
    elif semantic_segmentation.is_segmenter(request.arch):
        task = semantic_segmentation.TASK
    else:
        task = image_classification.TASK
    refuse_flags_not_for(task, request.options, TASKS)
    return task
