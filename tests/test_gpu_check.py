"""scripts/gpu_check.sh --dry-run-cpu: every step of the GPU check runs here, so the script cannot rot
between the rare runs on a real GPU."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import ROOT

STEPS = [
    "train one epoch, then resume",
    "export resnet18 with parity (fp32, TF32 off)",
    "export resnet18 with parity (fp16)",
    "serve with bentoml on the device",
    "serving benchmark",
    "workers per device",
    "TensorRT execution provider",
    "any model (a text classifier) exported and served on the device",
    "a Hugging Face text classifier exported, served and measured on the device",
    "a detector and a segmenter exported, served and measured on the device",
    "token classification, embeddings, reranking, a Hugging Face image classifier, masks and keypoints on the device",
    "an audio classifier, a CLIP and a Whisper exported, served and measured on the device",
    "a fine-tuned language model exported, served and measured on the device (and vLLM where installed)",
]


def test_gpu_check_dry_run_on_the_cpu(tmp_path: Path):
    out = tmp_path / "check"
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run-cpu", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = json.loads((out / "gpu_check.json").read_text())
    failed = [(s["name"], s["error"]) for s in report["steps"] if not s["ok"]]
    assert result.returncode == 0 and report["passed"], failed or result.stdout[-3000:]
    assert report["mode"] == "dry-run-cpu" and report["environment"]["requested_device"] == "cpu"
    steps = {s["name"]: s["details"] for s in report["steps"]}
    assert list(steps) == STEPS
    assert steps["train one epoch, then resume"]["backend"] == "gloo"
    for precision in ("fp32, TF32 off", "fp16"):
        parity = steps[f"export resnet18 with parity ({precision})"]
        assert parity["pass"] and {r["artifact"] for r in parity["results"]} == {
            "model.onnx",
            "model.pt2",
            "model.torchscript.pt",
        }
        assert parity["precision"]["tf32"] is False
    assert steps["serve with bentoml on the device"]["info"]["provider"] == "CPUExecutionProvider"
    bench = steps["serving benchmark"]
    assert set(bench["ours"]) == {"1", "16", "64"} and all(r["errors"] == 0 for r in bench["ours"].values())
    workers = steps["workers per device"]
    sides = {"ours_2_workers", "peer_floor", "floor_2_sessions", "floor_2_shared_model"}
    assert set(workers) == {f"{side} c=16" for side in sides}
    assert all(line.endswith("errors 0") for line in workers.values()), workers
    trt = steps["TensorRT execution provider"]
    # No GPU here: the step must say why TensorRT could not run, not pass silently.
    assert trt["loaded"] is False and ("TensorRT" in trt["why"] or "fell back" in trt["why"]), trt
    any_model = steps["any model (a text classifier) exported and served on the device"]
    assert any_model["provider"] == "CPUExecutionProvider" and any_model["max_abs_difference"] <= 1e-3
    hf = steps["a Hugging Face text classifier exported, served and measured on the device"]
    assert hf["parity"] == {"model.onnx": True} and hf["max_abs_difference"] <= 1e-3
    assert set(hf["ours"]) == {"1", "64"} and all(r["errors"] == 0 for r in hf["ours"].values())
    images = steps["a detector and a segmenter exported, served and measured on the device"]
    detector, segmenter = images["fasterrcnn_mobilenet_v3_large_320_fpn"], images["lraspp_mobilenet_v3_large"]
    assert detector["parity"] and detector["matched"] > 0 and segmenter["pixels_equal"] >= 0.999
    tasks = steps[STEPS[-3]]
    assert set(tasks) == {"tokens", "embed", "rerank", "hf-image"}  # the R-CNNs on a GPU
    assert all(task["parity"] == {"model.onnx": True} for task in tasks.values()), tasks
    assert tasks["rerank"]["ours_over_limit_c64"] > 0, tasks
    assert tasks["hf-image"]["task"] == "image-classification" and tasks["rerank"]["task"] == "text-ranking"
    media = steps[STEPS[-2]]
    assert media["audio"]["task"] == "audio-classification" and media["audio"]["parity"] == {"model.onnx": True}
    assert media["image-text"]["parity"] == {"image/model.onnx": True, "text/model.onnx": True}, media
    assert media["speech"]["parity"] == {"encoder/model.onnx": True, "decoder/model.onnx": True}, media
    assert media["audio"]["ours_over_limit_c16"] > 0, media
    generation = steps[STEPS[-1]]
    assert generation["served_device"] == "cpu" and generation["genai"]["precision"] == "fp32"
    assert generation["handoff_equals_transformers"] and generation["parity"]["tokens_compared"] > 0, generation
    assert generation["vllm"] == "not installed" and generation["ratios"]["ours_over_limit_c16"] > 0
    assert (out / "gpu_check.log").read_text().count("===") == 2 * len(STEPS)
