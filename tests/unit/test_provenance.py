"""Provenance (export/provenance.py): every tensor of the exported model is the checkpoint's, or it is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from export.parity import uninformative
from export.provenance import load_checked, trace
from export.readers.folders import _model_keys
from export.unwrap import LoadMismatch, unwrap_keys


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))


class TiedNet(nn.Module):
    """A model that declares a tie as transformers' models do (`get_expanded_tied_weights_keys`)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 5, bias=False)

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        return {"head.weight": "embed.weight"}

    def tie_weights(self) -> None:
        self.head.weight = self.embed.weight


def load(model: nn.Module, state: dict, partial: bool = False):
    unwrapped = unwrap_keys(state, set(model.state_dict()))
    loaded, tied = load_checked(model, unwrapped, "net", partial)
    return trace(model, unwrapped, loaded, tied, "net", partial)


def test_every_tensor_is_traced_and_hashed():
    state = {f"module.{k}": v.clone() for k, v in net().state_dict().items()}
    proof = load(net(), state)
    assert proof.matched == proof.model_tensors == len(state) and proof.complete and len(proof.sha256) == 64
    changed = dict(state)
    changed["module.2.bias"] = changed["module.2.bias"] + 1
    assert load(net(), changed).sha256 != proof.sha256


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda s: s.pop("2.weight"), "missing: 2.weight"),
        (lambda s: s.update({"3.weight": torch.zeros(1)}), "unexpected: 3.weight"),
        (lambda s: s.update({"2.weight": torch.zeros(3, 9)}), "shape mismatch: 2.weight"),
    ],
)
def test_what_does_not_fit_is_refused_in_one_line(change, needle):
    state = net().state_dict()
    change(state)
    with pytest.raises(LoadMismatch, match=needle) as refused:
        load(net(), state)
    assert "\n" not in str(refused.value)


def test_nothing_that_fits_is_refused_even_when_partial():
    with pytest.raises(LoadMismatch, match="not one tensor fits"):
        load(net(), {"other.weight": torch.zeros(2)}, partial=True)


def test_a_deliberate_partial_load_is_recorded():
    state = net().state_dict()
    del state["2.weight"], state["2.bias"]
    state["old_head.weight"] = torch.zeros(2)
    proof = load(net(), state, partial=True)
    assert proof.not_loaded == ["2.bias", "2.weight"] and proof.unused == ["old_head.weight"]
    assert "PARTIAL" in proof.line() and proof.to_manifest()["pass"]


def test_nan_weights_are_refused():
    state = net().state_dict()
    state["0.weight"] = torch.full_like(state["0.weight"], float("nan"))
    with pytest.raises(LoadMismatch, match="NaN or Inf"):
        load(net(), state)


def test_only_a_tie_the_model_declares_stands_in_for_a_missing_tensor():
    source = TiedNet()
    proof = load(TiedNet(), {"embed.weight": source.embed.weight.detach().clone()})
    assert proof.tied == {"head.weight": "embed.weight"} and proof.complete
    plain = nn.ModuleDict({"embed": nn.Embedding(5, 4), "head": nn.Linear(4, 5, bias=False)})
    with pytest.raises(LoadMismatch, match="missing: head.weight"):
        load(plain, {"embed.weight": source.embed.weight.detach().clone()})


def test_dcp_model_keys_are_found_by_structure():
    """PyTorch's FSDP2 recipe (`app.model` beside `app.optim`, whose state is keyed by parameter names),
    `{"model": ...}` and torchtitan's top level, never the optimizer's tensors."""
    recipe = ["app.model.fc.weight", "app.optim.state.fc.weight.exp_avg", "app.optim.state.fc.weight.step"]
    assert _model_keys(recipe)[0] == {"fc.weight": "app.model.fc.weight"}
    nested = ["model.fc.weight", "model.model.embed.weight", "optimizer.state.model.fc.weight.exp_avg"]
    assert _model_keys(nested)[0] == {"fc.weight": "model.fc.weight", "model.embed.weight": "model.model.embed.weight"}
    titan = ["fc.weight", "optimizer.state.fc.weight.exp_avg", "model_ema.module.fc.weight"]
    assert _model_keys(titan) == ({"fc.weight": "fc.weight"}, {"module.fc.weight": "model_ema.module.fc.weight"})


def test_a_parity_over_outputs_that_never_move_compares_nothing():
    inputs = [np.random.default_rng(0).normal(size=(4, 3))]
    assert "same output for all 4 inputs" in uninformative([np.ones((4, 2))], inputs)
    weak = np.ones((4, 2)) + 1e-3 * np.arange(4)[:, None]  # a weak model whose logits still move
    assert uninformative([weak], inputs) is None
    assert uninformative([np.ones((4, 2))], [np.ones((4, 3))]) is None  # inputs alike: nothing to tell
