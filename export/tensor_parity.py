"""Parity for any model: every artifact against the eager model, on the example's own rows.

Cases: the first row, two rows, every row of the example (the batch dimension at three sizes), and for each
length the `--dynamic` dimensions share, the example cut to about half of it (a truncated sequence) and, for
integer inputs (token ids), to the shortest, 2 (torch.export fixes a dimension of size 1): each dynamic dimension
at its extremes, the example's own length being the longest. A model whose outputs are the same for every row is
not compared (`uninformative`). Each output is held to `close_by_row` (floats within atol + rtol x the row's
scale; integers and booleans exactly), per case.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from contract.manifest import ONNX, PT2, TORCHSCRIPT
from export.parity import Comparison, Tolerance, close_by_row, onnx_sessions, uninformative
from export.tensor_model import Example, SignatureModule, first_line

Runner = Callable[[Example], list[np.ndarray]]


def parity_cases(example: Example, dynamic: dict[str, tuple[int, ...]]) -> list[tuple[str, Example]]:
    rows = example.rows
    cases = [("1 row", example.select([0])), ("2 rows", example.select([0, 1 % rows]))]
    if rows > 2:
        cases.append((f"{rows} rows", example))
    lengths = sorted({example.inputs[n].shape[d] for n, dims in dynamic.items() for d in dims})
    # A sequence of ids is also cut to the shortest; a float input's side (an image's) only to half, since
    # convolutions have a smallest size of their own.
    sequences = any(not example.inputs[n].is_floating_point() for n in dynamic)
    for length in lengths:
        for shorter in sorted({max(2, length // 2), 2 if sequences else max(2, length // 2)}, reverse=True):
            if shorter < length:
                cases.append((f"length {length} cut to {shorter}", example.narrowed(dynamic, shorter, length)))
    return cases


def _numpy(outputs: Any) -> list[np.ndarray]:
    return [o.detach().cpu().numpy() for o in (outputs if isinstance(outputs, (tuple, list)) else (outputs,))]


def _runners(folder: Path, formats: list[str], device: torch.device) -> list[tuple[str, str, str, str, Runner]]:
    runners: list[tuple[str, str, str, str, Runner]] = []
    if "onnx" in formats:
        for provider, where, session in onnx_sessions(folder / ONNX, device):
            # an input the graph does not use is not among its inputs: fed only what it takes
            names = tuple(i.name for i in session.get_inputs())

            def run_onnx(case: Example, session: Any = session, names: tuple[str, ...] = names) -> list[np.ndarray]:
                return session.run(None, {n: case.inputs[n].numpy() for n in names})

            runners.append((ONNX, "onnxruntime", provider, where, run_onnx))
    if "pt2" in formats:
        program = torch.export.load(str(folder / PT2)).module().to(device)

        def run_pt2(case: Example) -> list[np.ndarray]:
            with torch.inference_mode():
                return _numpy(program(*(t.to(device) for t in case.inputs.values())))

        runners.append((PT2, "torch.export", "torch", device.type, run_pt2))
    if "torchscript" in formats:
        scripted = torch.jit.load(str(folder / TORCHSCRIPT), map_location=device).eval()

        def run_ts(case: Example) -> list[np.ndarray]:
            with torch.inference_mode():
                return _numpy(scripted(*(t.to(device) for t in case.inputs.values())))

        runners.append((TORCHSCRIPT, "torchscript", "torch", device.type, run_ts))
    return runners


def run_tensor_parity(
    model: SignatureModule,
    folder: Path,
    example: Example,
    dynamic: dict[str, tuple[int, ...]],
    formats: list[str],
    device: torch.device,
    tol: Tolerance,
) -> tuple[list[Comparison], list[str], str | None]:
    """Each written artifact against the eager `model` on every case; the cases' descriptions; and why that
    compared nothing (export/parity.py's `uninformative`: the same outputs for every row), or None."""
    model = model.to(device).eval()
    cases = parity_cases(example, dynamic)
    with torch.inference_mode():
        references = [_numpy(model(*(t.to(device) for t in case.inputs.values()))) for _, case in cases]
    widest = max(range(len(cases)), key=lambda i: cases[i][1].rows)  # a case holding every row of the example
    not_checked = uninformative(references[widest], [t.numpy() for t in cases[widest][1].inputs.values()])
    results = []
    for artifact, runtime, provider, where, run in _runners(folder, formats, device):
        worst_abs, worst_rel, reasons = 0.0, 0.0, []
        for (name, case), reference in zip(cases, references):
            try:
                outputs = run(case)
            except Exception as err:  # noqa: BLE001 - an artifact that cannot run a case fails parity, it does not crash
                worst_abs = worst_rel = float("inf")
                reasons.append(f"{name}: {runtime} raised: {first_line(err)}")
                continue
            if len(outputs) != len(reference):
                worst_abs = worst_rel = float("inf")
                reasons.append(f"{name}: {len(outputs)} outputs, the eager model {len(reference)}")
                continue
            for output, expected, got in zip(model.output_names, reference, outputs, strict=True):
                got = np.asarray(got)
                max_abs, max_rel, close = close_by_row(expected, got, tol)
                worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
                if close:
                    continue
                if got.shape != expected.shape:
                    reasons.append(f"{name}: {output} has shape {list(got.shape)}, eager {list(expected.shape)}")
                elif got.dtype.kind == "f" and not np.isfinite(got).all():
                    reasons.append(f"{name}: NaN or Inf in {output}")
                else:
                    reasons.append(f"{name}: {output} outside the tolerance (max abs {max_abs:.2e})")
        reason = reasons[0] if reasons else None
        results.append(Comparison(artifact, runtime, provider, where, worst_abs, worst_rel, None, not reasons, reason))
    return results, [name for name, _ in cases], not_checked
