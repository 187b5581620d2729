"""Key unwrapping: wrapper prefixes removed only where that makes a key the model's own."""

import pytest
import torch

from export.unwrap import LoadMismatch, unwrap_keys

T = torch.zeros(1)
MODEL_KEYS = {"conv.weight", "fc.weight", "module.inner.weight"}  # a model with a real submodule named `module`


@pytest.mark.parametrize(
    "key, expected, removed",
    [
        ("conv.weight", "conv.weight", []),
        ("module.conv.weight", "conv.weight", ["module."]),
        ("_orig_mod.module.conv.weight", "conv.weight", ["module.", "_orig_mod."]),
        ("module._orig_mod.conv.weight", "conv.weight", ["module.", "_orig_mod."]),
        ("module.inner.weight", "module.inner.weight", []),  # the model's own `module` is kept
        ("module.module.inner.weight", "module.inner.weight", ["module."]),
    ],
)
def test_wrapper_segments(key, expected, removed):
    result = unwrap_keys({key: T}, MODEL_KEYS)
    assert list(result.state_dict) == [expected] and result.removed == removed


def test_attribute_prefix_and_its_outsiders():
    result = unwrap_keys({"model.conv.weight": T, "model.fc.weight": T, "criterion.weight": T}, MODEL_KEYS)
    assert set(result.state_dict) == {"conv.weight", "fc.weight"}
    assert result.removed == ["model. (attribute prefix)"] and result.ignored == ["criterion.weight"]


def test_two_keys_onto_one_is_ambiguous():
    with pytest.raises(LoadMismatch, match="ambiguous"):
        unwrap_keys({"conv.weight": T, "module.conv.weight": T}, MODEL_KEYS)


def test_unknown_keys_stay_for_the_strict_load_to_report():
    assert "extra.weight" in unwrap_keys({"extra.weight": T}, MODEL_KEYS).state_dict


def test_a_model_two_attributes_deep_in_a_wrapper_under_ddp():
    """A user's `Wrapper(net=Net(backbone=model))` under DDP: `module.net.backbone.` is removed as one prefix."""
    result = unwrap_keys({"module.net.backbone.conv.weight": T, "module.net.backbone.fc.weight": T}, MODEL_KEYS)
    assert set(result.state_dict) == {"conv.weight", "fc.weight"}
    assert result.removed == ["module.", "net.backbone. (attribute prefix)"]


def test_beside_a_deep_prefix_the_wrappers_own_tensors_are_not_ignored():
    """Beside Lightning's one-segment `model.`, the container's loss weights are its own; beside a user's deeper
    wrapper, a head outside the model was trained with it and must be reported, not dropped."""
    found = unwrap_keys({"net.backbone.conv.weight": T, "net.head.weight": T}, MODEL_KEYS)
    assert "net.head.weight" in found.state_dict and not found.ignored
