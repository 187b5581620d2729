"""The TorchScript artifact computes in full fp32 on a GPU, whatever the cuDNN flags when it was traced."""

from pathlib import Path

import torch
import torch.nn as nn

from export.exporters import classifier_call, export_torchscript


def _baked_allow_tf32(path: Path) -> list[bool]:
    """aten::_convolution's last argument in the saved graph: the allow_tf32 flag the trace baked in."""
    graph = torch.jit.load(str(path)).inlined_graph
    return [node.inputsAt(node.inputsSize() - 1).toIValue() for node in graph.findAllNodes("aten::_convolution")]


def test_torchscript_convolutions_are_traced_with_tf32_off(tmp_path: Path):
    assert torch.backends.cudnn.allow_tf32  # PyTorch's default, which a plain trace would bake in
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    path = tmp_path / "model.torchscript.pt"
    export_torchscript(model, classifier_call(torch.randn(2, 3, 8, 8)), path, {})
    assert _baked_allow_tf32(path) == [False, False]
    assert torch.backends.cudnn.allow_tf32  # the process's own flag is left as it was
