"""Parity's pass rule scales with each output row (export/parity.py close_by_row): a diverged model's faithful
export passes, a wrong one still fails."""

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn

from export.exporters import classifier_call, export_onnx
from export.parity import DEFAULT_TOLERANCES, _compare, close_by_row

FP32 = DEFAULT_TOLERANCES["fp32"]


def diverged_model() -> nn.Module:
    """A classifier whose logits reach ~1e7, as the ImageNet example's main.py does at its default learning rate
    on a small batch: the last layer's weights blown up by a factor of 10^5."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    with torch.no_grad():
        model[-1].weight.mul_(1e5)
        model[-1].bias.mul_(1e5)
    return model.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = diverged_model()
    path = tmp_path_factory.mktemp("diverged") / "model.onnx"
    with torch.no_grad():
        export_onnx(model, classifier_call(torch.randn(2, 3, 16, 16)), path, {})
    x = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 50
    with torch.inference_mode():
        reference = model(x).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return reference, session.run(None, {"input": x.numpy()})[0]


def test_a_diverged_models_faithful_export_passes(exported):
    reference, onnx = exported
    assert np.abs(reference).max() > 1e5, "the model is diverged: huge logits"
    diff = np.abs(onnx.astype(np.float64) - reference)
    print(f"\nmax |logit| {np.abs(reference).max():.3g}, ONNX Runtime's max abs difference {diff.max():.3g}")
    max_abs, max_rel, top1, passed = _compare(reference, onnx, FP32)
    assert passed and top1 == 1.0, (max_abs, max_rel)


def test_float32_rounding_at_a_diverged_scale_passes_where_an_element_rule_failed():
    """The ImageNet example's case: activations of ~1e6, and one logit that cancels to about 10 while its row
    reaches ~1e7. The same layer computed in float32 and in float64 (both faithful) differ by units at that
    logit: far past atol + rtol x |10|, well within rtol x the row's scale."""
    rng = np.random.default_rng(0)
    hidden = rng.normal(scale=1e6, size=(4, 512))
    weight = rng.normal(size=(10, 512))
    weight[0] -= hidden[0] * (hidden[0] @ weight[0] - 10.0) / (hidden[0] @ hidden[0])  # row 0's logit: 10.0
    exact = hidden @ weight.T
    float32 = (hidden.astype(np.float32) @ weight.T.astype(np.float32)).astype(np.float64)
    gap = abs(float32[0, 0] - exact[0, 0])
    print(f"\nlogit {exact[0, 0]:.2f} in a row reaching {np.abs(exact[0]).max():.3g}: float32 differs by {gap:.3g}")
    assert not np.all(np.abs(float32 - exact) <= FP32.atol + FP32.rtol * np.abs(exact)), "the element rule fails it"
    assert close_by_row(exact, float32, FP32)[2]


def test_a_perturbed_weight_still_fails(exported):
    reference, onnx = exported
    wrong = onnx.copy()
    wrong[3, 2] += 1e-2 * np.abs(reference[3]).max()  # one logit off by 1% of its row's scale
    assert not _compare(reference, wrong, FP32)[3]


def test_integers_and_booleans_must_match_exactly():
    ids = np.array([[1, 2], [3, 4]])
    assert close_by_row(ids, ids.copy(), FP32)[2]
    assert not close_by_row(ids, ids + np.array([[0, 0], [0, 1]]), FP32)[2]
    flags = np.array([True, False])
    assert not close_by_row(flags, ~flags, FP32)[2]
    assert not close_by_row(np.zeros((2, 3)), np.zeros((2, 4)), FP32)[2], "a shape mismatch never passes"
