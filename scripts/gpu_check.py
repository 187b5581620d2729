"""The whole GPU path in one run: train with NCCL and resume, export with parity on CUDA (fp32 with TF32
off, and fp16), serve on the CUDA provider, benchmark the service, try TensorRT; then any model (a user's text
model), a Hugging Face text classifier (scripts/gpu_text.py), a detector and a segmenter (scripts/gpu_images.py), and
the tasks after them (scripts/gpu_tasks.py: token classification, embeddings, reranking, a Hugging Face image
classifier, Mask R-CNN, Keypoint R-CNN) and a fine-tuned language model (scripts/gpu_generation.py: the fp16 GenAI
model, and vLLM on its consolidated folder where installed), each exported, served and checked or measured on the
device.

    bash scripts/gpu_check.sh [--out DIR] [--dry-run-cpu] [--arch resnet50]

Every step is recorded in DIR/gpu_check.json as soon as it ends (so a run cut short still tells what it
reached); a step that fails is recorded with its error and the next steps still run. Exit 0 when every
step passed. `--dry-run-cpu` runs the same steps on the CPU (gloo, CPU provider), smaller, so CI keeps
this script working on machines without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gpu_generation import generation_on_device  # noqa: E402  (beside this script)
from gpu_images import images_on_device  # noqa: E402  (beside this script)
from gpu_tasks import media_on_device, tasks_on_device  # noqa: E402  (beside this script)
from gpu_text import text_on_device  # noqa: E402  (beside this script)

from bench.load import uploads  # noqa: E402
from bench.results import result_path  # noqa: E402
from bench.serve_throughput import default_sides  # noqa: E402
from bench.workload import workload_name  # noqa: E402
from contract.manifest import read_manifest_unchecked  # noqa: E402
from contract.ort_cuda import preload_cuda_libraries  # noqa: E402
from harness.server import BentoServer  # noqa: E402


@dataclass
class Step:
    name: str
    ok: bool
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Report:
    path: Path
    mode: str
    environment: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)

    def run(self, name: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        print(f"=== {name}", flush=True)
        started = time.monotonic()
        try:
            details, error = body(), None
        except Exception as err:  # noqa: BLE001 - recorded; the next steps still run
            details, error = {}, f"{type(err).__name__}: {err}"
            traceback.print_exc()
        step = Step(name, error is None, round(time.monotonic() - started, 2), details, error)
        self.steps.append(step)
        print(f"=== {name}: {'ok' if step.ok else 'FAILED: ' + str(error)} ({step.seconds:.1f} s)", flush=True)
        self.write()
        return details

    def write(self) -> None:
        record = {
            "mode": self.mode,
            "passed": all(s.ok for s in self.steps),
            "environment": self.environment,
            "steps": [asdict(s) for s in self.steps],
        }
        self.path.write_text(json.dumps(record, indent=2) + "\n")


def sh(cmd: list[str], log: Path, timeout: float = 600, **env: str) -> str:
    """Run a command from the repository root; its output goes to `log` and is returned; failure raises."""
    result = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {result.returncode}: {' | '.join(tail)}")
    return result.stdout + result.stderr


def environment(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "requested_device": device,
    }
    if torch.cuda.is_available():
        info |= {
            "gpu": torch.cuda.get_device_name(0),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    for package in ("torchvision", "onnx", "onnxruntime", "bentoml"):
        try:
            info[package] = __import__(package).__version__
        except ImportError as err:
            info[package] = f"missing ({err})"
    try:
        import onnxruntime

        info["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError:
        pass
    return info


def train_and_resume(out: Path, device: str, arch: str) -> dict[str, Any]:
    run = out / "run"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
        "train/main.py",
        "--out",
        str(run),
        "--workers",
        "2",
        "--arch",
        arch,
    ]
    first = sh([*torchrun, "--epochs", "1"], out / "train.log")
    second = sh([*torchrun, "--epochs", "2"], out / "resume.log")
    backend = re.search(r"backend (\w+), device (\S+)", first)
    accuracy = re.search(r"val acc1 ([\d.]+)%", second)
    if "resuming from" not in second:
        raise RuntimeError("the second run did not resume from the first one's checkpoint")
    details = {
        "backend": backend.group(1) if backend else None,
        "device": backend.group(2) if backend else None,
        "val_acc1_after_resume": float(accuracy.group(1)) if accuracy else None,
    }
    expected_backend = "nccl" if device == "cuda" else "gloo"
    if details["backend"] != expected_backend:
        raise RuntimeError(f"trained with backend {details['backend']}, expected {expected_backend}")
    return details


def export_with_parity(out: Path, arch: str, device: str, fp16: bool, image_size: int) -> dict[str, Any]:
    import torch
    import torchvision

    checkpoint = out / f"{arch}.pth"
    if not checkpoint.exists():  # the ImageNet example's container, random weights: parity needs no training
        torch.manual_seed(0)
        torch.save({"arch": arch, "state_dict": torchvision.models.get_model(arch).state_dict()}, checkpoint)
    folder = out / f"{arch}{'_fp16' if fp16 else ''}.export"
    sh(
        [
            sys.executable,
            "-m",
            "export",
            str(checkpoint),
            "--device",
            device,
            "--out",
            str(folder),
            "--no-bento",
            "--image-size",
            str(image_size),
            *(["--fp16"] if fp16 else []),
        ],
        out / f"export{'_fp16' if fp16 else ''}.log",
    )
    manifest = read_manifest_unchecked(folder)
    parity = manifest["parity"]
    if device == "cuda" and not any(r["device"] == "cuda" for r in parity["results"]):
        raise RuntimeError("no artifact was compared on CUDA")
    return {
        "folder": str(folder),
        "device": parity["device"],
        "precision": parity["precision"],
        "results": parity["results"],
        "pass": parity["pass"],
    }


def serve_on_device(out: Path, folder: str, device: str) -> dict[str, Any]:
    import io

    import httpx
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photo = io.BytesIO()
    Image.fromarray(load_sample_images().images[0]).save(photo, format="JPEG")
    with BentoServer(out / "serve.log", HANDOFF_MODEL_DIR=folder, HANDOFF_DEVICE=device) as server:
        ready_s = server.wait_ready()
        info = httpx.get(f"{server.url}/info", timeout=10).json()
        answer = httpx.post(f"{server.url}/classify", files={"image": ("photo.jpg", photo.getvalue())}, timeout=60)
        # The same photo through the Open Inference Protocol's binary infer (BYTES `image`), as tritonclient sends it
        (infer,) = uploads([photo.getvalue()], "oip_image")
        protocol = httpx.post(f"{server.url}{infer.path}", content=infer.body, headers=infer.headers, timeout=60)
    expected = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    if info.get("provider") != expected or info.get("device") != device:
        raise RuntimeError(f"/info reports {info.get('provider')} on {info.get('device')}, expected {expected}")
    if (info["batching"]["padded_to"] is not None) != (device == "cuda"):  # serve/model/batching.py: a GPU's batches
        raise RuntimeError(f"/info reports batches padded to {info['batching']['padded_to']} on {device}")
    if answer.status_code != 200:
        raise RuntimeError(f"/classify answered {answer.status_code}: {answer.text[:200]}")
    if protocol.status_code != 200:
        raise RuntimeError(f"the protocol's infer answered {protocol.status_code}: {protocol.text[:200]}")
    logits = next(o for o in protocol.json()["outputs"] if o["name"] == "logits")["data"]
    if max(range(len(logits)), key=logits.__getitem__) != answer.json()["predictions"][0]["index"]:
        raise RuntimeError("the protocol's infer and /classify disagree on the same photo's top-1")
    return {
        "ready_s": round(ready_s, 2),
        "info": {k: info.get(k) for k in ("runtime", "provider", "device", "ready", "batching")},
        "top1": answer.json()["predictions"][0],
    }


def any_model_on_device(out: Path, device: str) -> dict[str, Any]:
    """The user's own text model (tests/user_models: a plain DDP script, 2 gloo processes) exported with its parity
    reference on the device, served there, and asked over /predict: its answer against the eager model's."""
    import httpx
    import torch

    user = ROOT / "tests" / "user_models"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    sh(
        [*launch, str(user / "train_ddp.py"), "text", str(out / "text.pth")],
        out / "text_train.log",
        PYTHONPATH=str(user),
    )
    sys.path.insert(0, str(user))
    from models import TextClassifier  # the user's own class

    generator = torch.Generator().manual_seed(0)
    example = {
        "tokens": torch.randint(1, 100, (4, 12), generator=generator),
        "mask": torch.zeros(4, 12, dtype=torch.bool),
    }
    torch.save(example, out / "text_example.pt")
    folder = out / "text.export"
    export = [sys.executable, "-m", "export", str(out / "text.pth"), "--model", "models:TextClassifier"]
    flags = ["--example", str(out / "text_example.pt"), "--dynamic", "tokens:1", "--dynamic", "mask:1"]
    sh(
        [*export, *flags, "--device", device, "--out", str(folder), "--no-bento"],
        out / "text_export.log",
        PYTHONPATH=str(user),
    )
    model = TextClassifier()
    state = torch.load(out / "text.pth", map_location="cpu", weights_only=True)
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    with torch.inference_mode():
        expected = model.eval()(**example)
    with BentoServer(out / "text_serve.log", HANDOFF_MODEL_DIR=str(folder), HANDOFF_DEVICE=device) as server:
        server.wait_ready()
        info = httpx.get(f"{server.url}/info", timeout=10).json()
        answer = httpx.post(f"{server.url}/predict", json={"inputs": {k: v.tolist() for k, v in example.items()}})
    if answer.status_code != 200:
        raise RuntimeError(f"/predict answered {answer.status_code}: {answer.text[:200]}")
    gap = float((torch.tensor(answer.json()["outputs"]["output"]) - expected).abs().max())
    if gap > 1e-3:
        raise RuntimeError(f"the served text model differs from the eager one by {gap:.2e}")
    return {"provider": info.get("provider"), "device": info.get("device"), "max_abs_difference": gap}


def serving_benchmark(
    out: Path, folder: str, device: str, seconds: float, rounds: int, sides: list[str]
) -> dict[str, Any]:
    sh(
        [
            sys.executable,
            "-m",
            "bench",
            "serve_throughput",
            "--device",
            device,
            "--export",
            folder,
            "--seconds",
            str(seconds),
            "--rounds",
            str(rounds),
            "--sides",
            *sides,
            "--results-dir",
            str(out),
        ],
        out / "bench.log",
        timeout=900,
    )
    result = json.loads(result_path("serve_throughput", device, workload_name(Path(folder)), out).read_text())
    ours = result["services"]["ours"]
    if "peer_minimal" in sides:  # batching must pay: on an H200, unpadded batches once made ours 0.22 x at c=16
        slower = {
            c: round(ours[c]["images_per_s"] / result["services"]["peer_minimal"][c]["images_per_s"], 2)
            for c in ("16", "64")
        }
        if min(slower.values()) < 1:
            raise RuntimeError(f"ours is slower than the peer that never batches (ours / peer_minimal: {slower})")
    return {
        "limit_images_per_s": result["limit"]["images_per_s"],
        "ratios": result["ratios"],
        "ours": {c: {k: ours[c][k] for k in ("images_per_s", "p50_ms", "p99_ms", "errors")} for c in ("1", "16", "64")},
    }


def workers_per_device(out: Path, folder: str, device: str, dry_run: bool, rounds: int | None) -> dict[str, Any]:
    """HANDOFF_WORKERS 1, 2 and 4 on one device at c=64 and c=256 against the limit and the floor peer, and the
    floor's workers each with a session on the device or all feeding one model process (bench/workers.py
    --arrangements): the measurements that pick the default workers per GPU and how they share it."""
    workers, levels, seconds = (["2"], ["16"], "2") if dry_run else (["1", "2", "4"], ["64", "256"], "6")
    times = str(rounds or (1 if dry_run else 2))  # --bench-rounds shortens this step too
    sh(
        [sys.executable, "-m", "bench", "workers", "--device", device, "--export", folder, "--workers", *workers]
        + ["--concurrency", *levels, "--seconds", seconds, "--rounds", times, "--results-dir", str(out)]
        + ["--arrangements"],
        out / "workers.log",
        timeout=900,
    )
    workload = workload_name(Path(folder), "arrangements")
    return json.loads(result_path("workers", device, workload, out).read_text())["figures"]


def tensorrt(out: Path, folder: str) -> dict[str, Any]:
    """Reported, not required: whether ONNX Runtime's TensorRT provider loads and agrees with the CUDA one."""
    import numpy as np
    import onnxruntime as ort

    preload_cuda_libraries()
    available = ort.get_available_providers()
    if "TensorrtExecutionProvider" not in available:
        return {"loaded": False, "why": f"this onnxruntime build has no TensorRT provider (it has {available})"}
    cache = tempfile.mkdtemp(prefix="trt-cache-", dir=out)
    options = {"trt_engine_cache_enable": True, "trt_engine_cache_path": cache}
    model = str(Path(folder) / "model.onnx")
    try:
        session = ort.InferenceSession(
            model, providers=[("TensorrtExecutionProvider", options), "CPUExecutionProvider"]
        )
    except Exception as err:  # noqa: BLE001 - the reason is the result
        return {"loaded": False, "why": f"{type(err).__name__}: {str(err)[:300]}"}
    active = session.get_providers()[0]
    if active != "TensorrtExecutionProvider":
        return {"loaded": False, "why": f"the session fell back to {active} (TensorRT libraries missing?)"}
    shape = [1 if d in (-1, None) or isinstance(d, str) else d for d in session.get_inputs()[0].shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    trt_out = session.run(None, {session.get_inputs()[0].name: x})[0]
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {session.get_inputs()[0].name: x})[
        0
    ]
    return {"loaded": True, "max_abs_error_vs_cpu": float(np.abs(trt_out - cpu).max()), "engine_cache": cache}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json and the logs")
    p.add_argument("--dry-run-cpu", action="store_true", help="run every step on the CPU, smaller (what CI runs)")
    p.add_argument("--arch", default=None, help="model exported and served (default: resnet50; resnet18 in a dry run)")
    p.add_argument("--bench-seconds", type=float, default=None, help="each load window (default: 8; 2 in a dry run)")
    p.add_argument(
        "--bench-rounds",
        type=int,
        default=None,
        help="serving rounds, and the workers step's (default: 3 and 2; 1 in a dry run)",
    )
    args = p.parse_args()
    device = "cpu" if args.dry_run_cpu else "cuda"
    arch = args.arch or ("resnet18" if args.dry_run_cpu else "resnet50")
    image_size = 32 if args.dry_run_cpu else 224  # fp16 convolutions on the CPU are slow: keep CI short
    # the dry run checks the steps, not the figures: on the CPU a small model trains in a quarter of the time
    train_arch = "shufflenet_v2_x0_5" if args.dry_run_cpu else "resnet18"
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out / "gpu_check.json", "dry-run-cpu" if args.dry_run_cpu else "cuda")
    report.environment = environment(device)
    report.write()
    if device == "cuda" and not report.environment["cuda_available"]:
        print(
            "gpu_check: torch sees no CUDA device; run with --dry-run-cpu to check the steps on the CPU",
            file=sys.stderr,
        )
        return 2

    report.run("train one epoch, then resume", lambda: train_and_resume(args.out, device, train_arch))
    fp32 = report.run(
        f"export {arch} with parity (fp32, TF32 off)",
        lambda: export_with_parity(args.out, arch, device, False, image_size),
    )
    report.run(
        f"export {arch} with parity (fp16)", lambda: export_with_parity(args.out, arch, device, True, image_size)
    )
    if fp32:
        report.run("serve with bentoml on the device", lambda: serve_on_device(args.out, fp32["folder"], device))
        # the dry run checks the step works, not the figures: ours alone, briefly
        sides = ["ours"] if args.dry_run_cpu else default_sides(device)
        seconds = args.bench_seconds or (2 if args.dry_run_cpu else 8)
        rounds = args.bench_rounds or (1 if args.dry_run_cpu else 3)
        report.run(
            "serving benchmark", lambda: serving_benchmark(args.out, fp32["folder"], device, seconds, rounds, sides)
        )
        report.run(
            "workers per device",
            lambda: workers_per_device(args.out, fp32["folder"], device, args.dry_run_cpu, args.bench_rounds),
        )
        report.run("TensorRT execution provider", lambda: tensorrt(args.out, fp32["folder"]))
    report.run(
        "any model (a text classifier) exported and served on the device", lambda: any_model_on_device(args.out, device)
    )
    text_seconds = args.bench_seconds or (2 if args.dry_run_cpu else 8)
    text_rounds = args.bench_rounds or (1 if args.dry_run_cpu else 3)
    text_sides = ["ours"] if args.dry_run_cpu else ["ours", "ours_oip", "peer_batched"]
    report.run(
        "a Hugging Face text classifier exported, served and measured on the device",
        lambda: text_on_device(args.out, device, text_seconds, text_rounds, text_sides),
    )
    report.run(
        "a detector and a segmenter exported, served and measured on the device",
        lambda: images_on_device(args.out, device, text_seconds, text_rounds, args.dry_run_cpu),
    )
    report.run(
        "token classification, embeddings, reranking, a Hugging Face image classifier, masks and keypoints on the "
        "device",
        lambda: tasks_on_device(args.out / "tasks", device, text_seconds, text_rounds, args.dry_run_cpu),
    )
    report.run(
        "an audio classifier, a CLIP and a Whisper exported, served and measured on the device",
        lambda: media_on_device(args.out / "media", device, text_seconds, text_rounds, args.dry_run_cpu),
    )
    report.run(
        "a fine-tuned language model exported, served and measured on the device (and vLLM where installed)",
        lambda: generation_on_device(args.out / "generation", device, text_seconds, text_rounds),
    )
    passed = all(s.ok for s in report.steps)
    print(f"gpu_check: {sum(s.ok for s in report.steps)}/{len(report.steps)} steps passed; {report.path}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
