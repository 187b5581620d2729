"""Write the artifacts: ONNX (torch.export-based exporter), torch.export's ExportedProgram (`model.pt2`),
an AOTInductor package (opt-in), TorchScript (trace, checked; deprecated upstream, kept for stacks that
still load it), safetensors."""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from contract.manifest import MANIFEST, ONNX_DATA

log = logging.getLogger(__name__)

OPSET = 18  # pinned and recorded in the manifest; ONNX Runtime 1.31 runs it on every provider
EXTERNAL_DATA_BYTES = 1 << 30  # above this, weights go to model.onnx.data (protobuf's limit is 2 GiB)


def check_eval_mode(model: nn.Module) -> None:
    training = [name or "<root>" for name, m in model.named_modules() if m.training]
    if training:
        raise RuntimeError(f"modules still in training mode after eval(): {', '.join(training[:5])}")


@dataclass(frozen=True)
class ExportCall:
    """What every exporter is given: example inputs (batch >= 2, or the exporters would fix the batch at 1),
    the names of the inputs and outputs, and torch.export's dynamic_shapes (dimension 0 always dynamic)."""

    inputs: tuple[torch.Tensor, ...]
    input_names: list[str]
    output_names: list[str]
    dynamic_shapes: tuple[Any, ...]

    def other_batch(self) -> tuple[torch.Tensor, ...]:
        """The same rows, cycled to a batch 3 larger: a second shape for the trace check, nothing invented."""
        rows = self.inputs[0].shape[0]
        index = torch.arange(rows + 3) % rows
        return tuple(t.index_select(0, index) for t in self.inputs)


def classifier_call(example: torch.Tensor) -> ExportCall:
    """An image classifier's: `input` N x C x H x W -> `logits`, the batch dynamic."""
    assert example.shape[0] >= 2, "trace with batch >= 2 so the batch axis stays dynamic"
    return ExportCall((example,), ["input"], ["logits"], ({0: torch.export.Dim("batch", min=1, max=4096)},))


def export_onnx(
    model: nn.Module,
    call: ExportCall,
    path: Path,
    metadata: dict[str, str],
    external_data_bytes: int = EXTERNAL_DATA_BYTES,
) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter is not the user's business
        program = torch.onnx.export(
            model,
            call.inputs,
            dynamo=True,
            opset_version=OPSET,
            input_names=call.input_names,
            output_names=call.output_names,
            dynamic_shapes=call.dynamic_shapes,
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


def _dynamic_program(model: nn.Module, call: ExportCall) -> torch.export.ExportedProgram:
    return torch.export.export(model, call.inputs, dynamic_shapes=call.dynamic_shapes, strict=False)


def export_pt2(model: nn.Module, call: ExportCall, path: Path, manifest_fields: dict) -> dict:
    """torch.export's ExportedProgram, loadable with `torch.export.load(path).module()` and torch alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = _dynamic_program(model, call)
    torch.export.save(program, str(path), extra_files={MANIFEST: json.dumps(manifest_fields)})
    return {"files": [path.name]}


def export_aoti(model: nn.Module, call: ExportCall, path: Path) -> dict:
    """An AOTInductor package: the model compiled ahead of time to a shared library (C++ compiler needed),
    loadable with `torch._inductor.aoti_load_package(path)`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = _dynamic_program(model, call)
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    return {"files": [path.name]}


def export_torchscript(model: nn.Module, call: ExportCall, path: Path, manifest_fields: dict) -> dict:
    # A trace bakes the cuDNN flags of the moment into every convolution (aten::_convolution's allow_tf32
    # argument), whatever the flags where it later runs. Traced with the default (TF32 on), it ran resnet50's
    # convolutions in TF32 on an H200 and failed fp32 parity (max abs 5.5e-2): trace with TF32 off.
    with warnings.catch_warnings(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, call.inputs, check_trace=True, check_inputs=[call.other_batch()])
    torch.jit.save(traced, str(path), _extra_files={MANIFEST: json.dumps(manifest_fields)})
    return {"files": [path.name]}


def export_safetensors(model: nn.Module, path: Path, arch: str) -> dict:
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"arch": arch})
    return {"files": [path.name]}
