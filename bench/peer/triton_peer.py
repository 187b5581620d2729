"""NVIDIA Triton as a peer (bench/serve_throughput.py's side `peer_triton`): the `tritonserver` 2.51 that the
`nvidia-pytriton` 0.7.0 wheel bundles, run on a standard model repository, as Triton's docs set one up.

The wheel bundles the server and its Python backend, not the ONNX Runtime backend, so the model is a Python
backend model (bench/peer/triton_model.py) holding an ONNX Runtime session with the service's settings, and
Triton's dynamic batcher hands it each batch to run in one call. `config.pbtxt`: `max_batch_size` as the service's
(32), `dynamic_batching` with Triton's defaults, one `KIND_CPU` instance. The wheel is unpacked (not installed:
only the server is used) into bench/.triton (gitignored) the first time. Two things make it start here: the
bundled libraries (`nvidia_pytriton.libs`) on LD_LIBRARY_PATH, and a virtualenv's `bin` first on PATH, so that the
backend's stub process (the one for this Python version) runs the model with that environment's numpy and ONNX
Runtime rather than the system's. That virtualenv is the peer's own (bench/peer/venvs.py), with numpy below 2, as
the wheel requires: with the project's numpy 2 the stub answered every output empty (`binary_data_size` 0).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.peer.venvs import locked, peer_python  # noqa: E402
from contract.manifest import read_manifest_unchecked  # noqa: E402
from contract.signature import read_signature  # noqa: E402
from harness.server import BentoServer, free_port  # noqa: E402
from serve.config import usable_cores  # noqa: E402

WHEEL = "nvidia-pytriton==0.7.0"
TARGET = ROOT / "bench" / ".triton"
MODEL_NAME = "handoff"  # the same path as the service's protocol: /v2/models/handoff/infer
MAX_BATCH_SIZE = 32
# what the Python backend's stub runs the model with (and ONNX Runtime); Pillow for the image model's decoding
STUB_PACKAGES = ("numpy<2", locked("pillow"))

TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "int64": "TYPE_INT64", "int32": "TYPE_INT32"}


def install_triton() -> Path:
    """The unpacked wheel (downloaded through pip the first time); its server binary's folder."""
    server = TARGET / "pytriton" / "tritonserver"
    if not (server / "bin" / "tritonserver").is_file():
        with tempfile.TemporaryDirectory() as download:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", download],
                check=True,
                timeout=600,
            )
            (wheel,) = Path(download).glob("*.whl")
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(TARGET)
        (server / "bin" / "tritonserver").chmod(0o755)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "backends" / "python" / "triton_python_backend_stub"
    if not stub.is_file():  # the stub for this interpreter, where the backend looks for it
        shutil.copy(server / "python_backend_stubs" / version / "triton_python_backend_stub", stub)
        stub.chmod(0o755)
    return server


def model_repository(folder: Path, export: Path, images: bool = False) -> Path:
    """A Triton model repository serving `export` by its signature: config.pbtxt and 1/model.py. With `images`,
    the model takes encoded image files (`image`, BYTES [N, 1], as handoff's protocol does) instead of the
    preprocessed tensor, and decodes them itself."""
    signature = read_signature(read_manifest_unchecked(export))
    model = folder / MODEL_NAME
    (model / "1").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "peer" / "triton_model.py", model / "1" / "model.py")

    def tensors(specs: tuple) -> str:
        return ",\n".join(
            f'  {{ name: "{t.name}", data_type: {TRITON_TYPES[t.dtype]}, dims: {list(t.shape[1:])} }}' for t in specs
        )

    image_input = '  { name: "image", data_type: TYPE_STRING, dims: [1] }'
    (model / "config.pbtxt").write_text(
        f'name: "{MODEL_NAME}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        f"input [\n{image_input if images else tensors(signature.inputs)}\n]\n"
        f"output [\n{tensors(signature.outputs)}\n]\n"
        "dynamic_batching { }\n"
        "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
        f'parameters: {{ key: "export", value: {{ string_value: "{export}" }} }}\n'
        f'parameters: {{ key: "threads", value: {{ string_value: "{usable_cores()}" }} }}\n'
    )
    return folder


class TritonServer(BentoServer):
    """`tritonserver` on a repository made for the export, HTTP on a free port (gRPC and metrics on others)."""

    ready_path = "/v2/health/ready"

    def __init__(self, log: Path, export: Path, images: bool = False) -> None:
        server = install_triton()
        python = peer_python("triton", STUB_PACKAGES)
        self.repository = Path(tempfile.mkdtemp(prefix="triton-repo-"))
        model_repository(self.repository, export, images)
        libraries = TARGET / "nvidia_pytriton.libs"
        env = {
            "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(libraries), os.environ.get("LD_LIBRARY_PATH")])),
            "PATH": os.pathsep.join([str(python.parent), os.environ.get("PATH", "")]),
            "PYTHONPATH": str(ROOT),  # the model imports the service's session settings
        }
        command = [
            str(server / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={server / 'backends'}",
            f"--grpc-port={free_port()}",
            f"--metrics-port={free_port()}",
            "--log-verbose=0",
            "--http-port",
        ]
        self._start(log, command, ROOT, env)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.repository, ignore_errors=True)
