"""The served tasks: one module each, one registry from the manifest's `task` to the class that serves it.

Adding a task: its module here (a `ServedTask`, serve/tasks/base.py), one line below, its module under
export/tasks/, a docs page and its tests (docs/design.md, "Adding a task").
"""

from __future__ import annotations

from contract.manifest import Manifest, ManifestError
from contract.signature import read_task
from serve.tasks.audio_classification import AudioClassification
from serve.tasks.base import ServedTask, Serving
from serve.tasks.image_classification import ImageClassification
from serve.tasks.image_text import ImageText
from serve.tasks.object_detection import ObjectDetection
from serve.tasks.semantic_segmentation import SemanticSegmentation
from serve.tasks.speech_recognition import SpeechRecognition
from serve.tasks.tensors import Tensors
from serve.tasks.text_classification import TextClassification
from serve.tasks.text_embedding import TextEmbedding
from serve.tasks.text_generation import TextGeneration
from serve.tasks.text_ranking import TextRanking
from serve.tasks.token_classification import TokenClassification

TASKS: dict[str, type[ServedTask]] = {
    task.name: task
    for task in (
        ImageClassification,
        TextClassification,
        TextRanking,
        TextEmbedding,
        TextGeneration,
        TokenClassification,
        ObjectDetection,
        SemanticSegmentation,
        AudioClassification,
        ImageText,
        SpeechRecognition,
        Tensors,
    )
}


def task_for(manifest: Manifest) -> type[ServedTask]:
    """The class that serves the manifest's task; ManifestError for a task this service does not know."""
    name = read_task(manifest)
    if name not in TASKS:
        raise ManifestError(f"task {name!r}: this service serves {', '.join(sorted(TASKS))} (a newer export?)")
    return TASKS[name]


__all__ = ["TASKS", "Serving", "ServedTask", "task_for"]
