"""Shared helpers: launch the real trainer under torchrun, read real checkpoint files, serve and call the
digits model over HTTP."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Under xdist the workers' trainers, exporters and servers run side by side: with torch's default of one OpenMP
# thread per core in each, they oversubscribe the cores and spin-wait (two 2-epoch trainers side by side here:
# 59.5 s with 2 threads each, 23.4 s with 1). Set before torch is imported; every process a test starts inherits
# it, and torchrun already sets 1 for its ranks. Runs that pin threads themselves (the service) are unaffected.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import httpx
import pytest
import torch
import yaml
from filelock import FileLock
from PIL import Image

from harness.reference import eager_from_export  # noqa: F401 - re-exported for the tests
from harness.server import BentoServer, free_port  # noqa: F401 - re-exported for the tests
from train.data import digits_split

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "train" / "main.py")


def torchrun_cmd(nproc: int, *train_args: str, launcher_args: tuple[str, ...] = ()) -> list[str]:
    if not launcher_args:
        launcher_args = ("--standalone",)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launcher_args,
        "--nproc-per-node",
        str(nproc),
        TRAIN,
        *train_args,
    ]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env(), stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def kubernetes_documents() -> list[dict]:
    """deploy/kubernetes.yaml's documents (the Deployment, its Service)."""
    return list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes.yaml").read_text()))


def deployment_container(documents: list[dict]) -> dict:
    """The service's container in the Deployment among `documents`."""
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


# The bounds the attack and load tests hold a served model to come from the deployment the project ships, never
# from what one machine measured: a probe slower than its timeout restarts the replica, so it is the bound on
# anything a test calls "at once"; and one client's attack may hold a fortieth of the memory a replica requests.
def probe_timeout_s() -> float:
    """deploy/kubernetes.yaml's liveness-probe timeout, in seconds."""
    return float(deployment_container(kubernetes_documents())["livenessProbe"]["timeoutSeconds"])


def replica_memory_mb() -> float:
    """The memory deploy/kubernetes.yaml requests for a replica, in MB (4 GiB: ~4,295 MB)."""
    requested = deployment_container(kubernetes_documents())["resources"]["requests"]["memory"]
    units = {"Mi": 2**20, "Gi": 2**30}
    return float(requested[:-2]) * units[requested[-2:]] / 1e6


def attack_memory_mb() -> float:
    """A fortieth of the memory a replica requests (~107 MB): what one client's attack may make it hold."""
    return replica_memory_mb() / 40


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def assert_serves_only_its_routes(url: str, own: set[str]) -> None:
    """The model's routes are `own` (e.g. {"POST /embed", ...}), said alike by GET /info and GET /docs.json, whose
    other paths are the routes every model has: no other task's route is documented (serve/http/routes.py)."""
    info = httpx.get(f"{url}/info", timeout=10).json()
    assert {f"{r['method']} {r['path']}" for r in info["routes"]} == own, info["routes"]
    document = httpx.get(f"{url}/docs.json", timeout=10).json()
    documented = {f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item}
    common = {"/", "/info", "/metrics", "/docs.json", "/livez", "/readyz", "/healthz"}
    tasks = {entry for entry in documented if entry.split()[1] not in common and not entry.split()[1].startswith("/v2")}
    assert tasks == own, tasks


Server = BentoServer  # the tests start the service exactly as `make demo` does
UNIT = Path(__file__).resolve().parent / "unit"
_TREE_BEFORE = pytest.StashKey[set[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--docs-assets",
        action="store_true",
        help="write the docs' generated files (docs/assets/*.png, docs/reference/openapi.json) from this run "
        "(`make docs-assets`); without it no test writes into the working tree",
    )


@pytest.fixture
def docs_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where a test writes what the docs show: docs/ under `--docs-assets`, else a folder of its own."""
    if request.config.getoption("--docs-assets"):
        return ROOT / "docs"
    (tmp_path / "docs" / "assets").mkdir(parents=True)
    (tmp_path / "docs" / "reference").mkdir()
    return tmp_path / "docs"


def _working_tree() -> set[str]:
    """`git status` of the checkout: the tracked files changed and the files git does not ignore."""
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return set(status.stdout.splitlines()) if status.returncode == 0 else set()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_TREE_BEFORE] = _working_tree()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No test writes into the working tree (`make docs-assets` is the one way the docs' files are rewritten):
    a run that changed a tracked file, or left one git does not ignore, fails and names them."""
    if hasattr(session.config, "workerinput") or session.config.getoption("--docs-assets"):
        return  # an xdist worker (the controller checks once), or the run asked to write the docs' files
    written = _working_tree() - session.config.stash.get(_TREE_BEFORE, set())
    if written:
        print(
            f"\nthe tests wrote into the working tree (or it was edited while they ran): {sorted(written)}",
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything outside tests/unit/ is end to end (real processes): `make test-fast` leaves it out."""
    for item in items:
        if UNIT not in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under `--dist loadgroup`, pytest-xdist marks each grouped test by a `@group` suffix on its node id. If
    that suffix is missing, the groups are ignored and every worker would build the costly module fixtures
    again (a Bento's virtualenv, a served model): fail before they start rather than do twice the work."""
    if getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("xdist_group"):
        if "@" not in item.nodeid:
            pytest.fail(
                "pytest-xdist ignores xdist_group under this pytest (pytest-dev/pytest-xdist#1386): "
                "install the versions pyproject.toml allows (make install)",
                pytrace=False,
            )


def run_wide_folder(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A folder every xdist worker of this run shares (the run's own base folder; without xdist, this
    session's), for fixtures built once per run instead of once per worker."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The digits model trained for 2 epochs and exported: what the serving tests serve. Built by the first
    worker that needs it, under a lock; the other waits and reads it (the tests copy it, never change it)."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    run_dir = shared / "digits_run"
    with FileLock(str(shared / "digits_run.lock")):
        if not (run_dir / "last.export" / "manifest.json").is_file():
            shutil.rmtree(run_dir, ignore_errors=True)  # a half-built one, from a worker that failed
            trained = run([sys.executable, TRAIN, "--epochs", "2", "--workers", "0", "--out", str(run_dir)])
            assert trained.returncode == 0, trained.stderr
            done = run([sys.executable, "-m", "export", str(run_dir / "last.pt"), "--no-bento"])
            assert done.returncode == 0, done.stderr
    return run_dir / "last.export"


@pytest.fixture(scope="session")
def text_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny DistilBERT fine-tuned by Hugging Face's Trainer under torchrun (2 gloo processes,
    tests/fixtures/hf_text_trainer.py), and its checkpoint-30 exported with no flags (checkpoint-30.export).
    Built once per run, like `exported`."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    run_dir = shared / "text_run"
    with FileLock(str(shared / "text_run.lock")):
        if not (run_dir / "checkpoint-30.export" / "manifest.json").is_file():
            shutil.rmtree(run_dir, ignore_errors=True)
            script = str(ROOT / "tests" / "fixtures" / "hf_text_trainer.py")
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
            trained = run([*launcher, script, str(run_dir)])
            assert trained.returncode == 0, trained.stderr[-3000:]
            done = run([sys.executable, "-m", "export", str(run_dir / "checkpoint-30"), "--no-bento"])
            assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def photo_jpegs(sizes: tuple[tuple[int, int], ...]) -> list[bytes]:
    """scikit-learn's two photos, in turn, resized to each (width, height) of `sizes`, as JPEG (quality 90)."""
    from sklearn.datasets import load_sample_images

    found = []
    for k, size in enumerate(sizes):
        buffer = io.BytesIO()
        Image.fromarray(load_sample_images().images[k % 2]).resize(size).save(buffer, format="JPEG", quality=90)
        found.append(buffer.getvalue())
    return found


def _trained_and_exported(shared: Path, name: str, script: str, exports: list[list[str]]) -> Path:
    """`script` (tests/fixtures) run under torchrun with 2 gloo processes into shared/name, then each of `exports`
    (python -m export's arguments, the run's folder as {run}); once per run, like `exported`."""
    run_dir = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        done_marker = run_dir / "exported"
        if not done_marker.is_file():
            shutil.rmtree(run_dir, ignore_errors=True)
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
            trained = run([*launcher, str(ROOT / "tests" / "fixtures" / script), str(run_dir)])
            assert trained.returncode == 0, trained.stderr[-3000:]
            for arguments in exports:
                done = run([sys.executable, "-m", "export", *(a.format(run=run_dir) for a in arguments), "--no-bento"])
                assert done.returncode == 0, done.stderr[-3000:]
            done_marker.touch()
    return run_dir


@pytest.fixture(scope="session")
def detection_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A Faster R-CNN trained by a plain DDP script (tests/fixtures/detection_ddp.py): checkpoint.pth in the
    detection references' layout exported with no flags (checkpoint.export), ddp_state.pt with --arch."""
    exports = [["{run}/checkpoint.pth"], ["{run}/ddp_state.pt", "--arch", "fasterrcnn_mobilenet_v3_large_320_fpn"]]
    return _trained_and_exported(
        run_wide_folder(tmp_path_factory, worker_id), "detection_run", "detection_ddp.py", exports
    )


@pytest.fixture(scope="session")
def segmentation_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A DeepLabV3 trained by a plain DDP script (tests/fixtures/segmentation_ddp.py): checkpoint.pth in the
    segmentation references' layout exported with no flags, ddp_state.pt with --arch (ONNX only)."""
    arch = ["--arch", "deeplabv3_mobilenet_v3_large", "--formats", "onnx"]
    exports = [["{run}/checkpoint.pth"], ["{run}/ddp_state.pt", *arch]]
    shared = run_wide_folder(tmp_path_factory, worker_id)
    return _trained_and_exported(shared, "segmentation_run", "segmentation_ddp.py", exports)


@pytest.fixture(scope="session")
def embedding_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny BERT sentence encoder trained by Hugging Face's Trainer under torchrun (tests/fixtures/
    hf_embedding_trainer.py): its checkpoint-20 and its sentence-transformers folders (st/ as 2.x-5.x write them,
    st6/ as 6.x does), each exported with no flags (checkpoint-20.export, st.export, st6.export)."""
    exports = [["{run}/checkpoint-20"], ["{run}/st"], ["{run}/st6"]]
    shared = run_wide_folder(tmp_path_factory, worker_id)
    return _trained_and_exported(shared, "embedding_run", "hf_embedding_trainer.py", exports)


@pytest.fixture(scope="session")
def pair_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny BERT cross-encoder (one logit) trained on (query, passage) pairs by Hugging Face's Trainer under
    torchrun (tests/fixtures/hf_pair_trainer.py), its checkpoint-80 exported with no flags (checkpoint-80.export)."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    return _trained_and_exported(shared, "pair_run", "hf_pair_trainer.py", [["{run}/checkpoint-80"]])


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A LoRA adapter on a tiny DistilBERT classifier trained with PEFT by Hugging Face's Trainer under torchrun
    (tests/fixtures/hf_lora_trainer.py): base/ and the adapter's checkpoint-60, exported with no flags."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    return _trained_and_exported(shared, "lora_run", "hf_lora_trainer.py", [["{run}/checkpoint-60"]])


@pytest.fixture(scope="session")
def instance_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A Mask R-CNN (mask/) and a Keypoint R-CNN (keypoint/) trained by a plain DDP script under torchrun
    (tests/fixtures/instance_ddp.py), each checkpoint.pth in the detection references' layout exported with no flags
    (its args name the builder's min_size and max_size)."""
    exports = [["{run}/mask/checkpoint.pth"], ["{run}/keypoint/checkpoint.pth"]]
    shared = run_wide_folder(tmp_path_factory, worker_id)
    return _trained_and_exported(shared, "instance_run", "instance_ddp.py", exports)


@pytest.fixture(scope="session")
def hf_image_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny ViT trained on the digits by Hugging Face's Trainer under torchrun (tests/fixtures/hf_image_trainer.py),
    its processor saved beside it, checkpoint-300 exported with no flags (checkpoint-300.export)."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    return _trained_and_exported(shared, "hf_image_run", "hf_image_trainer.py", [["{run}/checkpoint-300"]])


@pytest.fixture(scope="session")
def audio_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny wav2vec2 and a tiny AST audio classifier trained by Hugging Face's Trainer under torchrun (tests/
    fixtures/hf_audio_trainer.py), each checkpoint-30 exported with no flags (MODEL/checkpoint-30.export)."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    exports = [["{run}/wav2vec2/checkpoint-30"], ["{run}/ast/checkpoint-30"]]
    return _trained_and_exported(shared, "audio_run", "hf_audio_trainer.py", exports)


@pytest.fixture(scope="session")
def image_text_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny CLIP fine-tuned by Trainer and a tiny SigLIP by a plain DDP loop, under torchrun (tests/fixtures/
    hf_image_text_trainer.py): clip/checkpoint-30 exported with no flags, siglip/ddp_state.pt with --hf-config."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    siglip = ["{run}/siglip/ddp_state.pt", "--hf-config", "{run}/siglip/base", "--out", "{run}/siglip/ddp_state.export"]
    return _trained_and_exported(
        shared, "image_text_run", "hf_image_text_trainer.py", [["{run}/clip/checkpoint-30"], siglip]
    )


@pytest.fixture(scope="session")
def open_clip_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny open_clip model fine-tuned by open_clip's own trainer under torchrun (tests/fixtures/
    open_clip_trainer.py): its run's logs/tiny/checkpoints/epoch_2.pt and the model folder open_clip reads as
    local-dir: (folder/), each exported with no flags."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    exports = [["{run}/logs/tiny/checkpoints/epoch_2.pt"], ["{run}/folder"]]
    return _trained_and_exported(shared, "open_clip_run", "open_clip_trainer.py", exports)


@pytest.fixture(scope="session")
def families_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny Qwen2, Qwen3, Phi-3, Gemma 2, Mistral and SmolLM3 fine-tuned by Trainer under torchrun (tests/
    fixtures/hf_families_trainer.py), each FAMILY/checkpoint-20 exported with no flags but SmolLM3's (its no-RoPE
    layers are refused: tests/test_families.py)."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    exports = [[f"{{run}}/{name}/checkpoint-20"] for name in ("qwen2", "qwen3", "phi3", "gemma2", "mistral")]
    return _trained_and_exported(shared, "families_run", "hf_families_trainer.py", exports)


@pytest.fixture(scope="session")
def whisper_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny Whisper fine-tuned by Seq2SeqTrainer under torchrun as the "Fine-Tune Whisper" recipe does (tests/
    fixtures/hf_whisper_trainer.py), its checkpoint-60 exported with no flags (checkpoint-60.export)."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    return _trained_and_exported(shared, "whisper_run", "hf_whisper_trainer.py", [["{run}/checkpoint-60"]])


@pytest.fixture(scope="session")
def token_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny DistilBERT entity tagger trained by Hugging Face's Trainer under torchrun (tests/fixtures/
    hf_token_trainer.py), its checkpoint-40 exported with no flags (checkpoint-40.export)."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    return _trained_and_exported(shared, "token_run", "hf_token_trainer.py", [["{run}/checkpoint-40"]])


@pytest.fixture(scope="session")
def language_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A tiny Llama chat model fine-tuned by Hugging Face's Trainer under torchrun (tests/fixtures/
    hf_causal_trainer.py), its checkpoint-40 exported with no flags (checkpoint-40.export) and rank 0's DDP
    state_dict with --hf-config and the user's own parity prompts (ddp_state.export)."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    exports = [
        ["{run}/checkpoint-40"],
        ["{run}/ddp_state.pt", "--hf-config", "{run}/base", "--out", "{run}/ddp_state.export"]
        + ["--prompts", "{run}/prompts.json"],
    ]
    return _trained_and_exported(shared, "language_run", "hf_causal_trainer.py", exports)


@pytest.fixture(scope="session")
def language_fsdp2_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The same tiny Llama fine-tuned with FSDP2 and saved with DCP (tests/fixtures/causal_fsdp2.py), as PyTorch's
    recipe (recipe.export) and torchtitan (torchtitan.export) save it, each exported with --hf-config."""
    shared = run_wide_folder(tmp_path_factory, worker_id)
    exports = [
        ["{run}/" + layout, "--hf-config", "{run}/base", "--out", "{run}/" + layout + ".export"]
        for layout in ("recipe", "torchtitan")
    ]
    return _trained_and_exported(shared, "language_fsdp2_run", "causal_fsdp2.py", exports)


@pytest.fixture(scope="session")
def eager(exported: Path):
    """The eager model behind the export, with its torchvision evaluation transform."""
    return eager_from_export(exported)


def eager_top1(eager, images: list[Image.Image]) -> list[int]:
    model, transform = eager
    with torch.inference_mode():
        return model(torch.stack([transform(img) for img in images])).argmax(1).tolist()


def png_bytes(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def digit_images(count: int) -> tuple[list[Image.Image], list[int]]:
    _, (x_val, y_val) = digits_split()
    return [Image.fromarray(img).convert("RGB") for img in x_val[:count]], [int(y) for y in y_val[:count]]


def missing_cuda_library(python: Path, onnx_model: Path, cwd: Path) -> str:
    """The library ONNX Runtime's CUDA provider fails on in `python`'s environment, after preloading the
    pip-installed CUDA libraries (the service's own preload). On a machine without a GPU, a complete
    environment lacks only the driver, libcuda.so.1."""
    script = (
        "import onnxruntime as ort; from contract.ort_cuda import preload_cuda_libraries; "
        f"preload_cuda_libraries(); ort.InferenceSession({str(onnx_model)!r}, providers=['CUDAExecutionProvider'])"
    )
    result = subprocess.run([str(python), "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120)
    failure = re.search(r"Failed to load library .*? with error: (\S+?):", result.stderr)
    assert failure, result.stderr[-2000:]
    return failure.group(1)


def classify(url: str, data: bytes, name: str = "image.png", field: str = "image", **params) -> httpx.Response:
    return httpx.post(
        f"{url}/classify", files={field: (name, data)}, data={k: str(v) for k, v in params.items()}, timeout=60
    )
