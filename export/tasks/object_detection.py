"""Export a torchvision detector (Faster R-CNN, RetinaNet, FCOS, SSD, SSDlite, Mask R-CNN, Keypoint R-CNN): its
checkpoint in, one ONNX graph that takes an image and gives its detections, proven against the eager model on real
photos.

The graph holds the whole model as torchvision runs it: the transform (resize to the model's min_size/max_size,
normalize), the network, and the postprocessing with its NMS, score threshold and detections per image, boxes
mapped back to the image's own pixels. It takes one image, `image` 1 x 3 x H x W (RGB, floats in 0..1, any H and
W), and gives `boxes` 1 x D x 4, `scores` 1 x D and `labels` 1 x D for the D detections it kept (Mask R-CNN also
`masks` 1 x D x M x M, each over its box; Keypoint R-CNN `keypoints` 1 x D x K x 3: x, y, score). One image per
call because torchvision's detectors size and postprocess each image on its own (a batch is a list of images of
their own sizes); the service runs a batch's images one after another in its model thread.

ONNX is written by the TorchScript-based exporter (`dynamo=False`), the path torchvision's own ONNX tests take
for detection, from a copy whose resize and box decoding are written so the graph computes what eager does
(export/detection_graph.py); torch.export specialises the resize's data-dependent sizes. TorchScript and
torch.export files are skipped with that reason. Parity (export/detection_parity.py) against the untouched eager
model: scikit-learn's photos at several sizes, sizes where a float32 resize rounds, and an empty scene (where an
R-CNN's region proposal network may keep no box); and the graph's resized size against eager's over a sweep.
A detector that finds nothing on any of them is "not checked": no detection anywhere matches trivially. Masks and
keypoints are compared on the matched detections (export/instance_parity.py).

Sizes: torchvision's builders take `min_size` and `max_size`, which no checkpoint records; a training script that
passes them (Mask and Keypoint R-CNN resize to 800 by default) names them in its `args`, or --min-size and --max-size.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from contract.instances import MASK_THRESHOLD
from contract.manifest import FORMATS, ONNX, Manifest, embedded_fields, new_tensor_manifest
from contract.signature import TASK_OBJECT_DETECTION, Signature, TensorSpec
from export.architecture import load_by_heads
from export.detection_graph import (
    DetectionGraph,
    detection_outputs,
    exportable,
    no_proposal_failure,
    resize_mismatch,
)
from export.detection_parity import (
    BOX_TOLERANCE_PX,
    MIN_MATCHED_SHARE,
    SCORE_TOLERANCE,
    TOP_MATCHED,
    Detections,
    match_detections,
)
from export.exporters import OPSET
from export.inputs import sample_images
from export.instance_parity import InstanceGaps
from export.job import Job, log_loading, origin_fields
from export.parity import Comparison, Tolerance, onnx_sessions, parity_report, pin_precision
from export.pipeline import ExportRequest, ExportTask, close_manifest
from export.steps import timed
from export.tensor_model import first_line

log = logging.getLogger("export")

# Sizes parity runs at (height, width): landscape, portrait, small and square, each a view of a real photo; the
# last two round differently in float32 at min_size 320. Then EMPTY_SCENE: one grey image, nothing in it.
PARITY_SIZES = ((427, 640), (480, 360), (240, 320), (200, 200), (326, 363))
EMPTY_SCENE = (240, 320)
MAX_SAMPLES = 16  # --samples: each image is a run of the detector on each side
KEYPOINT_WEIGHT = "roi_heads.keypoint_predictor.kps_score_lowres.weight"  # in_channels x K x 4 x 4


def detection_architectures() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models.detection))


def is_detector(arch: str | None) -> bool:
    return arch is not None and arch in detection_architectures()


def _build(arch: str, num_classes: int, hints: dict[str, Any]) -> nn.Module:
    import torchvision

    kwargs: dict[str, Any] = {"weights": None, "weights_backbone": None, "num_classes": num_classes}
    if "rcnn" in arch and hints.get("rpn_score_thresh") is not None:  # as references/detection/train.py builds it
        kwargs["rpn_score_thresh"] = float(hints["rpn_score_thresh"])
    for size in ("min_size", "max_size", "num_keypoints"):
        if hints.get(size) is not None:
            kwargs[size] = int(hints[size])
    return torchvision.models.get_model(arch, **kwargs)


def _keypoint_count(state: dict[str, torch.Tensor]) -> int | None:
    """Keypoint R-CNN's K, from its keypoint predictor's weight (any wrapper prefix), else None."""
    found = [tensor for key, tensor in state.items() if key.endswith(KEYPOINT_WEIGHT)]
    return int(found[0].shape[1]) if found and found[0].ndim == 4 else None


def detection_settings(model: nn.Module) -> dict[str, Any]:
    """The model's own thresholds and sizes, as its postprocessing and transform hold them (the manifest's
    `detection`): an R-CNN keeps them in its roi_heads, the one-stage detectors on themselves."""
    heads: Any = getattr(model, "roi_heads", model)
    transform: Any = model.transform
    outputs = detection_outputs(model)
    predictor: Any = getattr(heads, "keypoint_predictor", None)
    return {
        "masks": {"resolution": 28, "threshold": MASK_THRESHOLD} if "masks" in outputs else None,
        "keypoints": int(predictor.kps_score_lowres.out_channels) if "keypoints" in outputs else None,
        "score_threshold": float(heads.score_thresh),
        "nms_threshold": float(heads.nms_thresh),
        "detections_per_image": int(heads.detections_per_img),
        "min_size": [int(s) for s in transform.min_size],
        "max_size": int(transform.max_size),
        "fixed_size": list(transform.fixed_size) if transform.fixed_size else None,
        "box_tolerance_px": BOX_TOLERANCE_PX,
        "score_tolerance": SCORE_TOLERANCE,
    }


def detection_signature(settings: dict[str, Any]) -> Signature:
    masks = settings.get("masks")
    keypoints = settings.get("keypoints")
    extra = (
        *([TensorSpec("masks", "float32", (-1, -1, masks["resolution"], masks["resolution"]))] if masks else []),
        *([TensorSpec("keypoints", "float32", (-1, -1, keypoints, 3))] if keypoints else []),
    )
    return Signature(
        (TensorSpec("image", "float32", (-1, 3, -1, -1)),),
        (
            TensorSpec("boxes", "float32", (-1, -1, 4)),
            TensorSpec("scores", "float32", (-1, -1)),
            TensorSpec("labels", "int64", (-1, -1)),
            *extra,
        ),
    )


def parity_images(samples: Path | None = None) -> tuple[list[np.ndarray], str]:
    """The images parity runs on, each 1 x 3 x H x W in 0..1, the empty scene last, and what they are: the user's
    own (--samples: up to MAX_SAMPLES, at their own sizes, as a detector trained on a domain of its own finds nothing
    in scikit-learn's photos), else views of scikit-learn's two photos at PARITY_SIZES."""
    from PIL import Image

    if samples is not None:
        photos = sample_images(samples, MAX_SAMPLES)
        described = f"your {len(photos)} images in {samples} at their own sizes"
    else:
        from sklearn.datasets import load_sample_images

        photos = [Image.fromarray(p) for p in load_sample_images().images]
        photos = [
            photos[k % len(photos)].resize((w, h), Image.Resampling.BILINEAR) for k, (h, w) in enumerate(PARITY_SIZES)
        ]
        described = f"scikit-learn's photos at {', '.join(f'{h} x {w}' for h, w in PARITY_SIZES)}"
    views = [np.ascontiguousarray(np.asarray(p).transpose(2, 0, 1)[None], dtype=np.float32) / 255 for p in photos]
    empty = np.full((1, 3, *EMPTY_SCENE), 0.5, dtype=np.float32)
    return [*views, empty], f"{described} and an empty grey scene at {EMPTY_SCENE[0]} x {EMPTY_SCENE[1]}"


def detection_job(request: ExportRequest) -> Job:
    """--labels: one name per class index (index 0 is torchvision's background)."""
    options, src, arch = request.options, request.source, str(request.arch)
    timings, device = request.timings, request.device
    labels, checkpoint = request.options.read.labels, request.checkpoint
    formats = request.options.write.formats
    if "onnx" not in formats:
        raise ValueError(
            f"--formats={','.join(formats)}: a detector is exported to ONNX (add onnx), which the service runs"
        )
    hints = {**src.preprocess_hints, "num_keypoints": _keypoint_count(src.state_dict)}
    hints |= {size: getattr(options.read, size) for size in ("min_size", "max_size") if getattr(options.read, size)}
    make = lambda n: _build(arch, n, hints)  # noqa: E731
    model, unwrapped, labels, provenance = load_by_heads(make, src, arch, labels, timings, options.read.allow_partial)
    log_loading(src, unwrapped)
    settings = detection_settings(model)
    origin = origin_fields(checkpoint, src, unwrapped, provenance)
    manifest = new_tensor_manifest(arch, detection_signature(settings), {"image": [2, 3]}, origin, timings)
    manifest |= {
        "task": TASK_OBJECT_DETECTION,
        "labels": labels,
        "detection": settings,
    }
    return Job(
        manifest,
        lambda out: write_detection_export(model, device, manifest, out, options.parity.samples, formats),
        f"{arch} ({len(labels)} classes, background included)",
    )


def export_detection_onnx(graph: DetectionGraph, path: Path, metadata: dict[str, str]) -> None:
    import onnx

    example = torch.from_numpy(parity_images()[0][2])
    outputs = list(graph.outputs)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's tracer warnings are torchvision's known ones
        torch.onnx.export(
            graph,
            (example,),
            str(path),
            dynamo=False,
            opset_version=OPSET,
            input_names=["image"],
            output_names=outputs,
            dynamic_axes={"image": {2: "height", 3: "width"}, **{name: {1: "detections"} for name in outputs}},
        )
    model = onnx.load(str(path))
    model.metadata_props.extend(onnx.StringStringEntryProto(key=k, value=v) for k, v in metadata.items())
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path), full_check=True)


def compare_detections(
    model: nn.Module, folder: Path, device: torch.device, settings: dict[str, Any], images: list[np.ndarray]
) -> tuple[list[Comparison], str | None, str | None]:
    """Each ONNX session's detections against the untouched eager model's on every parity image (module
    docstring's rule), masks and keypoints on the matched ones; why that compared nothing (no detection on any
    image), or None; and the masks' and keypoints' line of the report, or None."""
    reference = DetectionGraph(model).to(device).eval()
    names = reference.outputs
    with torch.no_grad():
        eager_outputs = [
            dict(zip(names, (t[0].cpu().numpy() for t in reference(torch.from_numpy(x).to(device))), strict=True))
            for x in images
        ]
    eager = [Detections(found["boxes"], found["scores"], found["labels"]) for found in eager_outputs]
    model.to("cpu")
    nothing = not any(len(e.scores) for e in eager)
    not_checked = (
        f"the eager model finds no detection on any of the {len(images)} parity images (an untrained or diverged "
        "detector, or one trained on images unlike them: --samples DIR gives parity yours): an artifact that finds "
        "nothing would match it"
        if nothing
        else None
    )
    # Only a region proposal network with a score threshold can keep no proposal (with none, it keeps its top-n)
    rpn_threshold = float(getattr(getattr(model, "rpn", None), "score_thresh", 0.0))
    graph_failure = no_proposal_failure(folder / ONNX, images[-1]) if rpn_threshold > 0 else None
    if settings.get("fixed_size") is None:  # SSD resizes to one fixed size: nothing rounds
        graph_failure = graph_failure or resize_mismatch(folder / ONNX, settings["min_size"][-1], settings["max_size"])
    results, instances = [], InstanceGaps()
    for provider, kind, session in onnx_sessions(folder / ONNX, device):
        worst_box = worst_score = 0.0
        matched = total = unmatched = 0
        reason = graph_failure
        for x, expected, eager_found in zip(images, eager, eager_outputs, strict=True):
            where = f"{x.shape[2]} x {x.shape[3]}"
            try:
                graph_found = dict(zip(names, (a[0] for a in session.run(list(names), {"image": x})), strict=True))
            except Exception as err:  # noqa: BLE001 - a graph that cannot run an image fails parity, in a line
                reason = reason or f"{where}: onnxruntime raised: {first_line(err)}"
                continue
            got = Detections(graph_found["boxes"], graph_found["scores"], graph_found["labels"])
            found = match_detections(
                expected, got, settings["score_threshold"], settings["detections_per_image"], settings["nms_threshold"]
            )
            instances.add(eager_found, graph_found, found.pairs, where)
            worst_box, worst_score = max(worst_box, found.worst_box_px), max(worst_score, found.worst_score)
            matched, total, unmatched = matched + found.matched, total + found.of, unmatched + found.unmatched
            if found.reason and reason is None:
                reason = f"{x.shape[2]} x {x.shape[3]}: {found.reason}"
        reason = reason or instances.reason
        share = matched / total if total else None  # nothing to match: said, not counted as 100%
        if reason is None and total and unmatched / total > 1 - MIN_MATCHED_SHARE:
            alike = len({round(float(v), 4) for e in eager for v in e.scores}) == 1
            reason = (
                f"{unmatched} detections unmatched (either side) against the eager model's {total}, more than "
                f"{100 * (1 - MIN_MATCHED_SHARE):g}%"
                + ("; it scores every one alike: untrained weights?" if alike else "")
            )
        results.append(
            Comparison(ONNX, "onnxruntime", provider, kind, worst_box, worst_score, share, reason is None, reason)
        )
    return results, not_checked, instances.line()


def detection_summary(results: list[Comparison], device: torch.device, images: int, rest: list[str]) -> list[str]:
    """The parity table a person reads: the worst box and score gaps of the matched detections, and how many of
    the eager model's were matched."""
    lines = [
        f"parity against the eager model on {device} (fp32, TF32 off; {images - 1} images and an empty "
        f"scene; pass: the same detections best first, labels equal, boxes within {BOX_TOLERANCE_PX:g} px, scores "
        f"within {SCORE_TOLERANCE:g}; the {TOP_MATCHED} best of each photo and {100 * MIN_MATCHED_SHARE:g}% of all; "
        "the resized size equal to eager's)",
        f"  {'artifact':<22} {'runtime / provider':<34} {'box px':>9} {'score':>9} {'matched':>7}  result",
    ]
    for r in results:
        matched = "-" if r.top1_agreement is None else f"{100 * r.top1_agreement:.1f}%"
        verdict = "pass" if r.passed else "FAIL: " + (r.reason or "outside tolerance")
        lines.append(
            f"  {r.artifact:<22} {r.runtime + ' / ' + r.provider:<34} {r.max_abs_error:9.2e} {r.max_rel_error:9.2e} "
            f"{matched:>7}  {verdict}"
        )
    return lines + rest


def write_detection_export(
    model: nn.Module, device: torch.device, manifest: Manifest, folder: Path, samples: Path | None, formats: list[str]
) -> int:
    """ONNX, proved; every other format asked for skipped with the reason, as write_formats skips a format its
    exporter cannot write."""
    with timed(manifest["timings"], "onnx"):
        try:
            export_detection_onnx(exportable(model), folder / ONNX, embedded_fields(manifest))
        except Exception as err:  # noqa: BLE001 - the exporter's own first line
            raise ValueError(
                f"the detector cannot be exported to onnx: {first_line(err)}; the service runs ONNX"
            ) from None
    manifest["onnx"] = {"opset": OPSET, "external_data": False, "exporter": "torchscript (dynamo=False)"}
    precision = pin_precision()
    images, images_described = parity_images(samples)
    with timed(manifest["timings"], "parity"):
        results, not_checked, instance_line = compare_detections(model, folder, device, manifest["detection"], images)
    reason = "torchvision's detectors take a list of images sized at run time; exported to ONNX only"
    tolerance = Tolerance(BOX_TOLERANCE_PX, SCORE_TOLERANCE, 1.0)
    described = (
        f"{images_described}: the same detections matched best first (label equal, boxes within "
        f"{BOX_TOLERANCE_PX:g} px, scores within {SCORE_TOLERANCE:g}): each photo's {TOP_MATCHED} best, and "
        f"{100 * MIN_MATCHED_SHARE:g}% of all; the graph's resized size against eager's over a sweep of sizes"
    )
    manifest["parity"] = parity_report(
        results,
        device,
        False,
        tolerance,
        precision,
        len(images),
        described,
        skipped={FORMATS[name]: reason for name in formats if name != "onnx"},
        batch_sizes=[1],
        not_checked=not_checked,
    )
    rest = manifest["parity"]["summary"][2 + len(results) :]
    lines = [instance_line] if instance_line else []
    manifest["parity"]["summary"] = detection_summary(results, device, len(images), lines) + rest
    return close_manifest(manifest, folder, [ONNX])


TASK = ExportTask(
    TASK_OBJECT_DETECTION,
    "torchvision detectors",
    detection_job,
    frozenset({"arch", "labels", "min_size", "max_size", "samples"}),
)
