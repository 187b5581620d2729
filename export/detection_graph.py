"""The torchvision detector as its ONNX graph runs it, and the two places where torchvision's own traced code makes
that graph answer differently from the eager model:

- **The resize rounds.** Traced, torchvision's transform computes the scale in float32 inside the graph, so for
  some sizes the short side comes out one pixel short of eager's (200 x 200 at min_size 320 becomes 319 x 319) and
  every pixel is resampled on a shifted grid. Here the graph computes the size as eager does, in float64:
  floor(side x min(min_size / short side, max_size / long side)), then resizes to exactly that size (eager's
  `recompute_scale_factor=True` resamples at that size's own scale, so the pixels are eager's).
- **Masks are not pasted.** Mask R-CNN's postprocess pastes each detection's 28 x 28 mask into an image-sized
  plane, D x H x W floats for D detections; the graph gives the small masks (`masks` 1 x D x M x M) and the service
  pastes them as torchvision does (contract/instances.py), only where a box is, in the upload's pixels.
- **No proposal survives.** On an empty scene an R-CNN's region proposal network can keep no box (a score
  threshold, as fasterrcnn_mobilenet_v3_large_320_fpn has); torchvision's box decoding then reshapes 0 rows with
  `-1`, which ONNX Runtime cannot resolve. Here the decoding names every dimension, so zero boxes decode to zero.

Both are changes of how the same arithmetic is written down, not of what it computes: parity compares the graph
with the untouched eager model (export/tasks/object_detection.py), and `resize_mismatch` checks the graph's resized
size against eager's over a sweep of sizes.
"""

from __future__ import annotations

import copy
import math
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# (height, width) whose resize rounds differently in float32 (at min_size 320 or 800), a sweep, and a phone photo.
RESIZE_SWEEP = (
    ((200, 200), (326, 363), (400, 437), (805, 805), (850, 850), (3000, 4000))
    + tuple((side, side) for side in range(150, 1000, 31))
    + tuple((side, side * 4 // 3) for side in range(151, 1000, 53))
)


def detection_outputs(model: nn.Module) -> tuple[str, ...]:
    """The graph's outputs: every detector's boxes, scores and labels; Mask R-CNN's masks; Keypoint R-CNN's
    keypoints (x, y and the keypoint's score, D x K x 3)."""
    heads: Any = getattr(model, "roi_heads", None)
    masks = ("masks",) if heads is not None and heads.has_mask() else ()
    keypoints = ("keypoints",) if heads is not None and heads.has_keypoint() else ()
    return ("boxes", "scores", "labels", *masks, *keypoints)


class DetectionGraph(nn.Module):
    """The detector called as the export runs it: one image (1 x 3 x H x W, 0..1) in, its detections out (the
    outputs `detection_outputs` names, each with a leading batch dimension of 1)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.outputs = detection_outputs(model)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        found = self.model([image[0]])[0]
        out = [found["boxes"], found["scores"], found["labels"]]
        if "masks" in self.outputs:  # D x 1 x M x M here (D x 1 x H x W from the untouched eager model)
            out.append(found["masks"][:, 0])
        if "keypoints" in self.outputs:
            out.append(torch.cat([found["keypoints"][..., :2], found["keypoints_scores"][..., None]], dim=-1))
        return tuple(t[None] for t in out)


def exportable(model: nn.Module) -> DetectionGraph:
    """A copy of `model`, its resize, box decoding and mask postprocessing written so the traced graph computes
    what eager does (less the masks' pasting, the service's)."""
    copied = copy.deepcopy(model).eval()
    transform: Any = copied.transform
    transform.resize = types.MethodType(_resize_as_eager, transform)
    transform.postprocess = types.MethodType(_postprocess_unpasted, transform)
    for owner in (getattr(copied, "rpn", None), getattr(copied, "roi_heads", None)):
        coder = getattr(owner, "box_coder", None)
        if coder is not None and hasattr(coder, "decode_single"):
            coder.decode = types.MethodType(_decode_any_count, coder)
    return DetectionGraph(copied).eval()


def _resize_as_eager(self: Any, image: torch.Tensor, target: Any = None) -> tuple[torch.Tensor, Any]:
    if self.training or self.fixed_size is not None or target is not None:
        return type(self).resize(self, image, target)  # training, SSD's fixed size: torchvision's own
    sides = torch._shape_as_tensor(image)[-2:].to(torch.float64)
    # Vectors, never 0-d tensors or Python numbers: the exporter computes those as float32 scalars.
    limits = torch.tensor([self.min_size[-1], self.max_size], dtype=torch.float64)
    short_long = torch.cat([sides.min(0, keepdim=True)[0], sides.max(0, keepdim=True)[0]])
    scale = (limits / short_long).min(0, keepdim=True)[0]
    size = torch.floor(sides * scale).to(torch.int64)
    traced_size: Any = (size[0], size[1])  # tensors: the traced graph computes the size, not a constant
    resized = F.interpolate(image[None], size=traced_size, mode="bilinear", align_corners=False)
    return resized[0], target


def _postprocess_unpasted(
    self: Any, result: list[dict[str, torch.Tensor]], image_shapes: list[Any], original_sizes: list[Any]
) -> list[dict[str, torch.Tensor]]:
    """torchvision's postprocess (boxes and keypoints back to the image's pixels) with the masks left M x M."""
    from torchvision.models.detection.transform import resize_boxes, resize_keypoints

    for found, resized, original in zip(result, image_shapes, original_sizes, strict=True):
        found["boxes"] = resize_boxes(found["boxes"], resized, original)
        if "keypoints" in found:
            found["keypoints"] = resize_keypoints(found["keypoints"], resized, original)
    return result


def _decode_any_count(self: Any, rel_codes: torch.Tensor, boxes: list[torch.Tensor]) -> torch.Tensor:
    reference = torch.cat(boxes, dim=0)
    count, width = reference.shape[0], rel_codes.shape[-1]
    decoded = self.decode_single(rel_codes.reshape(count, width), reference)
    return decoded.reshape(count, width // 4, 4)


def eager_size(height: int, width: int, min_size: int, max_size: int) -> tuple[int, int]:
    """The size torchvision's transform resizes an image to in eager mode (Python floats, as it computes it)."""
    scale = min(min_size / min(height, width), max_size / max(height, width))
    return math.floor(height * scale), math.floor(width * scale)


def resize_mismatch(onnx_path: Path, min_size: int, max_size: int) -> str | None:
    """The first size of RESIZE_SWEEP the graph resizes otherwise than eager, said in a line; None when none.
    Runs only the graph's first Resize (the transform's), cut out of the model, on blank images."""
    import onnx
    import onnxruntime as ort

    model = onnx.shape_inference.infer_shapes(onnx.load(str(onnx_path)))  # the cut needs its value infos
    resize = next(node for node in model.graph.node if node.op_type == "Resize")
    part = onnx.utils.Extractor(model).extract_model(["image"], [resize.output[0]])
    session = ort.InferenceSession(part.SerializeToString(), providers=["CPUExecutionProvider"])
    for height, width in RESIZE_SWEEP:
        blank = np.zeros((1, 3, height, width), dtype=np.float32)
        got = tuple(int(n) for n in session.run(None, {"image": blank})[0].shape[-2:])
        expected = eager_size(height, width, min_size, max_size)
        if got != expected:
            return (
                f"the graph resizes {height} x {width} to {got[0]} x {got[1]}, eager to {expected[0]} x {expected[1]}"
            )
    return None


RPN_OBJECTNESS_BIAS = "model.rpn.head.cls_logits.bias"


def no_proposal_failure(onnx_path: Path, image: np.ndarray) -> str | None:
    """Whether an R-CNN's graph answers as eager does (no detection, no error) when its region proposal network
    keeps no box: run on `image` with the objectness bias pushed far below the threshold, in a copy of the graph.
    None when it does, or for a detector with no region proposal network."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(onnx_path))
    found = [init for init in model.graph.initializer if init.name == RPN_OBJECTNESS_BIAS]
    if not found:
        return None
    bias = onnx.numpy_helper.to_array(found[0])
    found[0].CopyFrom(onnx.numpy_helper.from_array(np.full_like(bias, -1e4), RPN_OBJECTNESS_BIAS))
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the failure is reported here, in a line, not logged by the runtime
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    try:
        boxes = session.run(None, {"image": image})[0]
    except Exception as err:  # noqa: BLE001 - the runtime's own words, cut to a line
        return f"with no region proposal kept, onnxruntime raised: {str(err).splitlines()[0][:200]}"
    return (
        None if boxes.shape[1] == 0 else f"with no region proposal kept, the graph still gives {boxes.shape[1]} boxes"
    )
