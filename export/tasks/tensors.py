"""Any model the user trained (`--model module:factory --example FILE`): build it, load the checkpoint's weights,
describe it by running the example, write ONNX, torch.export and TorchScript (where tracing works), and prove each
against the eager model on the example's rows (export/tensor_parity.py).

    python -m export ckpt.pth --model mypkg.models:TextClassifier --example example.pt --dynamic tokens:1
"""

from __future__ import annotations

from contract.manifest import new_tensor_manifest
from contract.signature import TASK_TENSORS
from export.architecture import build_user_model
from export.exporters import check_eval_mode
from export.job import Job, log_loading, origin_fields
from export.pipeline import ExportRequest, ExportTask, tolerance_of, write_tensor_export
from export.steps import timed
from export.tensor_model import describe, load_example, parse_dynamic


def tensor_job(request: ExportRequest) -> Job:
    options, checkpoint, timings = request.options, request.checkpoint, request.timings
    formats, device = request.options.write.formats, request.device
    if options.read.model is None:
        raise ValueError("--example describes your own model: add --model module:factory, which builds it")
    assert options.read.example is not None  # export/tasks/__init__.py chose this task for it
    example = load_example(options.read.example)
    dynamic = parse_dynamic(options.read.dynamic, example)
    with timed(timings, "load"):
        src = request.source
        model, unwrapped, provenance = build_user_model(src, options.read.model, options.read.allow_partial)
    check_eval_mode(model)
    signature, wrapped = describe(model, example, dynamic)
    log_loading(src, unwrapped)  # after the checks: a refused export prints its one line and nothing else
    dims = {name: list(d) for name, d in dynamic.items()}
    origin = origin_fields(checkpoint, src, unwrapped, provenance)
    manifest = new_tensor_manifest(options.read.model, signature, dims, origin, timings)
    tol = tolerance_of(options)
    ins = ", ".join(t.name for t in signature.inputs)
    outs = ", ".join(t.name for t in signature.outputs)
    return Job(
        manifest,
        lambda folder: write_tensor_export(wrapped, example, dynamic, formats, device, tol, manifest, folder),
        f"{options.read.model} (inputs {ins}; outputs {outs})",
    )


TASK = ExportTask(TASK_TENSORS, "models of tensors (--example)", tensor_job, frozenset({"model", "example", "dynamic"}))
