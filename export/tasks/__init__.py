"""The export tasks: one module each, found through one registry, in the spirit of Optimum's task table. Each task
supplies its model (rebuilt and loaded with provenance), its example inputs, its signature, its manifest fields and
its own checks; export/pipeline.py holds the steps they share and export/run.py the whole.

A request goes to the first task that recognizes it, so the order matters: an example names the user's own model; a
Hugging Face folder a text classifier, a sentence encoder or an image classifier; an architecture a detector or a
segmenter; anything else is an image classifier. Adding a task: its module here (a `TASK = ExportTask(...)`), one
line below, its module under serve/tasks/, a docs page and its tests (docs/design.md, "Adding a task").
"""

from __future__ import annotations

from export.pipeline import ExportRequest, ExportTask
from export.tasks import (
    hf_image_classification,
    image_classification,
    object_detection,
    semantic_segmentation,
    tensors,
    text_classification,
    text_embedding,
    text_generation,
    text_ranking,
    token_classification,
)

TASKS: tuple[ExportTask, ...] = (
    tensors.TASK,
    text_ranking.TASK,
    text_classification.TASK,
    token_classification.TASK,
    text_embedding.TASK,
    text_generation.TASK,
    hf_image_classification.TASK,
    object_detection.TASK,
    semantic_segmentation.TASK,
    image_classification.TASK,
)


HF_ARCHITECTURES = (
    "*ForSequenceClassification, *ForTokenClassification, *ForImageClassification, *ForCausalLM and sentence "
    "encoders (*Model)"
)


def task_for(request: ExportRequest) -> ExportTask:
    """The first task that recognizes `request` (image classification takes any checkpoint but a Hugging Face
    one); ValueError, in one line, for a Hugging Face checkpoint no task takes."""
    for task in TASKS:
        if task.recognizes(request):
            if request.args.text_pairs and not task.takes_pairs:
                raise ValueError(f"--text-pairs: for a Hugging Face text classifier; this checkpoint is {task.name}")
            return task
    assert request.hf is not None
    raise ValueError(request.hf.refusal(HF_ARCHITECTURES))
