"""Write the artifacts: ONNX (torch.export-based exporter), torch.export's ExportedProgram (`model.pt2`),
an AOTInductor package (opt-in), TorchScript (trace, checked; deprecated upstream, kept for stacks that
still load it), safetensors."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from export.manifest import MANIFEST, ONNX_DATA

log = logging.getLogger(__name__)

OPSET = 18  # pinned and recorded in the manifest; ONNX Runtime 1.31 runs it on every provider
EXTERNAL_DATA_BYTES = 1 << 30  # above this, weights go to model.onnx.data (protobuf's limit is 2 GiB)


def check_eval_mode(model: nn.Module) -> None:
    training = [name or "<root>" for name, m in model.named_modules() if m.training]
    if training:
        raise RuntimeError(f"modules still in training mode after eval(): {', '.join(training[:5])}")


def export_onnx(
    model: nn.Module,
    example: torch.Tensor,
    path: Path,
    metadata: dict[str, str],
    external_data_bytes: int = EXTERNAL_DATA_BYTES,
) -> dict:
    """Dynamic batch dimension (the example must have batch >= 2, or the exporter specialises it to 1)."""
    assert example.shape[0] >= 2, "trace with batch >= 2 so the batch axis stays dynamic"
    batch = torch.export.Dim("batch", min=1, max=4096)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter is not the user's business
        program = torch.onnx.export(
            model,
            (example,),
            dynamo=True,
            opset_version=OPSET,
            input_names=["input"],
            output_names=["logits"],
            dynamic_shapes=({0: batch},),
            verbose=False,
        )
    assert program is not None, "torch.onnx.export(dynamo=True) returns the program"
    program.model.metadata_props.update(metadata)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    external = weight_bytes > external_data_bytes
    program.save(str(path), external_data=external)
    import onnx

    onnx.checker.check_model(str(path), full_check=True)
    files = [path.name] + ([ONNX_DATA] if external and (path.parent / ONNX_DATA).exists() else [])
    return {"opset": OPSET, "external_data": external, "files": files}


def _dynamic_batch_program(model: nn.Module, example: torch.Tensor) -> torch.export.ExportedProgram:
    assert example.shape[0] >= 2, "export with batch >= 2 so the batch axis stays dynamic"
    batch = torch.export.Dim("batch", min=1, max=4096)
    return torch.export.export(model, (example,), dynamic_shapes=({0: batch},), strict=False)


def export_pt2(model: nn.Module, example: torch.Tensor, path: Path, manifest_fields: dict) -> dict:
    """torch.export's ExportedProgram, loadable with `torch.export.load(path).module()` and torch alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = _dynamic_batch_program(model, example)
    torch.export.save(program, str(path), extra_files={MANIFEST: json.dumps(manifest_fields)})
    return {"files": [path.name]}


def export_aoti(model: nn.Module, example: torch.Tensor, path: Path) -> dict:
    """An AOTInductor package: the model compiled ahead of time to a shared library (C++ compiler needed),
    loadable with `torch._inductor.aoti_load_package(path)`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = _dynamic_batch_program(model, example)
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    return {"files": [path.name]}


def export_torchscript(model: nn.Module, example: torch.Tensor, path: Path, manifest_fields: dict) -> dict:
    other_batch = torch.randn((example.shape[0] + 3, *example.shape[1:]), dtype=example.dtype)
    # A trace bakes the cuDNN flags of the moment into every convolution (aten::_convolution's allow_tf32
    # argument), whatever the flags where it later runs. Traced with the default (TF32 on), it ran resnet50's
    # convolutions in TF32 on an H200 and failed fp32 parity (max abs 5.5e-2): trace with TF32 off.
    with warnings.catch_warnings(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example, check_trace=True, check_inputs=[(other_batch,)])
    torch.jit.save(traced, str(path), _extra_files={MANIFEST: json.dumps(manifest_fields)})
    return {"files": [path.name]}


def export_safetensors(model: nn.Module, path: Path, arch: str) -> dict:
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"arch": arch})
    return {"files": [path.name]}
