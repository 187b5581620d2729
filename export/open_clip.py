"""An open_clip model (export/readers/open_clip.py) exported as an image-text model's two towers, as a CLIPModel is
(export/tasks/image_text.py): images in, `image_embeds` out (`encode_image`); token ids in, `text_embeds` out
(`encode_text`); zero-shot scores from the two, as open_clip's `get_logits` computes them.

What open_clip does around the weights, carried into the export and proved against open_clip itself:
- its evaluation transform (resize, centre crop, normalise) as the manifest's `preprocess`, the service's pixels
  checked against the transform's on real photos and odd shapes;
- its SimpleTokenizer (OpenAI's byte-level BPE) as a `tokenizers` file, with its Python cleaning (ftfy, HTML
  entities, whitespace, lower case) named in the manifest (contract/tokenizer_spec.py's CLEANERS), every row padded
  with zeros to the context length as `open_clip.tokenize` pads it; ids checked equal to open_clip's;
- the reference: the model as open_clip itself loads the checkpoint (`create_model_and_transforms(name,
  pretrained=weights)`), its `encode_image` on its transform's pixels, its `encode_text` on its tokenizer's ids, and
  its logits' softmax over labels, against the written towers as the service runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from contract.image_text import ImageTextSettings
from contract.manifest import Manifest, new_tensor_manifest, read_manifest_unchecked
from contract.pil_transform import Preprocessor
from contract.preprocessing import Preprocessing
from contract.tokenizer_spec import TOKENIZER_JSON, TextTokenizer, TokenizerSettings
from export.hf_text import encode_samples, parity_samples
from export.hf_tokenizer import SENTENCES
from export.image_processor import EXACT, check_images
from export.inputs import REAL_IMAGES, real_images
from export.job import Job, log_loading, origin_fields
from export.parity import Tolerance
from export.pipeline import Check, ExportRequest, OwnChecks, tolerance_of, write_tensor_export
from export.provenance import load_checked, trace
from export.readers import read_source
from export.readers.open_clip import OPEN_CLIP_CONFIG, OpenClipCheckpoint, build_open_clip
from export.reference import ZERO_SHOT_LABELS, Reference, ServedModel
from export.steps import timed
from export.tensor_model import Example, describe
from export.towers import ImageTextTowers, image_tower, zero_shot_settings
from export.unwrap import unwrap_keys

TowerManifest = Callable[[Any, dict[str, tuple[int, ...]]], Manifest]  # a tower's manifest from its signature
EXPORTED_MODELS = ("CLIP", "CustomTextCLIP")  # two towers and a logit scale (CoCa's captioning decoder is more)
RESIZE_MODES = {"shortest": "shorter", "squash": "exact"}  # open_clip's resize_mode: the contract's
# texts whose cleaning and bytes exercise the tokenizer beyond the parity sentences: HTML entities, mojibake,
# ligatures and full-width letters (ftfy), accents, scripts, emoji, runs of whitespace, open_clip's own special
# tokens written in a text
TOKENIZER_TEXTS = (
    "AT&amp;T &lt;b&gt; caf&eacute;",
    "Ã©tÃ© mojibake",
    "\ufb01nally \uff21\uff22\uff23 \u2460",
    "Caf\u00e9 d\u00e9j\u00e0 vu \u2014 na\u00efve fa\u00e7ade",
    "emoji \U0001f600 \u6f22\u5b57 \u0414\u041e\u0411\u0420\u041e \u0130stanbul",
    "  tabs\tand\nnewlines\u00a0  ",
    "<start_of_text> written <end_of_text>",
    "DON'T stop!!! ... ???",
)


class ImageFeatures(nn.Module):
    """The image tower: normalised pixels in, `encode_image`'s embeddings out."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"image_embeds": self.model.encode_image(pixel_values)}


class TextFeatures(nn.Module):
    """The text tower: token ids (padded to the context length) in, `encode_text`'s embeddings out."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"text_embeds": self.model.encode_text(input_ids)}


def open_clip_towers(request: ExportRequest, checkpoint: OpenClipCheckpoint) -> ImageTextTowers:
    """An open_clip checkpoint's two towers, its zero-shot settings and open_clip's checks (the image-text task,
    export/tasks/image_text.py, binds them into the export)."""
    options = request.options
    with timed(request.timings, "load"):
        model, transform, tokenizer = build_open_clip(checkpoint)
        if type(model).__name__ not in EXPORTED_MODELS:
            exported = ", ".join(EXPORTED_MODELS)
            raise ValueError(f"{checkpoint.named_by}: an open_clip {type(model).__name__}; handoff exports {exported}")
        src = read_source(checkpoint.weights, trust_pickle=options.read.trust_pickle, ema=options.read.ema)
        what = f"{checkpoint.architecture} (as {checkpoint.named_by} describes it)"
        unwrapped = unwrap_keys(src.state_dict, set(model.state_dict()))
        loaded, tied = load_checked(model, unwrapped, what, options.read.allow_partial)
        provenance = trace(model.float().eval(), unwrapped, loaded, tied, what, options.read.allow_partial)
    log_loading(src, unwrapped)
    origin = origin_fields(checkpoint.weights, src, unwrapped, provenance)
    preprocess = preprocessing_of(model.visual.preprocess_cfg, checkpoint).to_manifest()
    served = TextTokenizer(tokenizer_json(tokenizer), tokenizer_settings(tokenizer, checkpoint))
    photos, _ = real_images(None, options.parity.samples, REAL_IMAGES)

    def tower_manifest(signature: Any, dynamic: dict[str, tuple[int, ...]]) -> Manifest:
        dims = {name: list(d) for name, d in dynamic.items()}
        return new_tensor_manifest(checkpoint.architecture, signature, dims, origin, request.timings)

    def transform_check(manifest: Manifest) -> Check:
        images = check_images(photos)
        ours = np.stack([Preprocessor.from_manifest(preprocess, max_pixels=1 << 40)(image) for image in images])
        theirs = torch.stack([transform(image) for image in images]).numpy()
        gap = float(np.abs(ours - theirs).max())
        manifest["preprocess_check"] = {"processor": "open_clip transform", "images": len(images), "max": gap}
        return ("open_clip transform", f"the served pixels differ by {gap:.2e}" if gap > EXACT else None)

    def config_file(out: Path) -> list[str]:
        if checkpoint.named_by.name != OPEN_CLIP_CONFIG:
            return []
        (out / OPEN_CLIP_CONFIG).write_bytes(checkpoint.named_by.read_bytes())
        return [OPEN_CLIP_CONFIG]

    settings = zero_shot_settings(model, sigmoid=bool(checkpoint.settings.get("siglip")))
    return ImageTextTowers(
        origin,
        checkpoint.architecture,
        image_tower(request, ImageFeatures(model).eval(), preprocess, photos, tower_manifest, transform_check),
        _text_tower(request, model, tokenizer, served, tower_manifest),
        preprocess,
        settings,
        open_clip_reference(checkpoint, preprocess, settings, tolerance_of(options)),
        photos,
        config_file,
        {"open_clip": {"model": checkpoint.model, "named_by": str(checkpoint.named_by), **checkpoint.settings}},
    )


def preprocessing_of(config: dict[str, Any], checkpoint: OpenClipCheckpoint) -> Preprocessing:
    """The contract's description of open_clip's evaluation transform; ValueError, in one line, for one the service
    does not reproduce (letterboxing to the longest side, a mode other than RGB)."""
    size = config["size"]
    side = size if isinstance(size, int) else size[0]
    where = f"{checkpoint.named_by}: open_clip's preprocessing"
    if not isinstance(size, int) and size[0] != size[1]:
        raise ValueError(f"{where} crops to {size[0]}x{size[1]}; handoff serves square crops")
    if config.get("resize_mode", "shortest") not in RESIZE_MODES:
        raise ValueError(f"{where} resizes by {config['resize_mode']!r}; handoff serves {', '.join(RESIZE_MODES)}")
    if config.get("mode", "RGB") != "RGB" or config.get("interpolation") not in ("bicubic", "bilinear"):
        raise ValueError(f"{where} is {config.get('mode')} with {config.get('interpolation')} interpolation")
    return Preprocessing(
        crop=side,
        resize=side,
        mean=tuple(float(v) for v in config["mean"]),
        std=tuple(float(v) for v in config["std"]),
        interpolation=str(config["interpolation"]),
        resize_mode=RESIZE_MODES[config.get("resize_mode", "shortest")],
    )


def tokenizer_settings(tokenizer: Any, checkpoint: OpenClipCheckpoint) -> TokenizerSettings:
    """How the service tokenizes for open_clip's text tower: SimpleTokenizer's cleaning, truncation to the context
    length (its end token kept), every row padded with zeros to it; ValueError for another tokenizer."""
    from open_clip.tokenizer import SimpleTokenizer, _clean_lower

    if not isinstance(tokenizer, SimpleTokenizer) or tokenizer.clean_fn is not _clean_lower or tokenizer.reduction_fn:
        raise ValueError(
            f"{checkpoint.named_by}: the model's tokenizer is {type(tokenizer).__name__}; handoff serves open_clip's "
            "own SimpleTokenizer with its default cleaning (a Hugging Face tokenizer is read from the hub)"
        )
    pad = tokenizer.decoder[0]
    return TokenizerSettings(
        TOKENIZER_JSON,
        tokenizer.context_length,
        0,
        pad,
        "right",
        ("input_ids",),
        pad_to_max_length=True,
        clean="open_clip",
    )


def tokenizer_json(tokenizer: Any) -> bytes:
    """open_clip's SimpleTokenizer as a `tokenizers` file: its vocabulary and merges (word ends marked `</w>`), its
    split of a cleaned text into words, bytes as printable characters, and its start and end tokens around each text.
    The cleaning itself is Python's (CLEANERS['open_clip']); the file's own normaliser repeats its whitespace and
    case steps."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    start, end = tokenizer.decoder[tokenizer.sot_token_id], tokenizer.decoder[tokenizer.eot_token_id]
    merges = [tuple(pair) for pair in sorted(tokenizer.bpe_ranks, key=tokenizer.bpe_ranks.get)]
    served = Tokenizer(models.BPE(vocab=dict(tokenizer.encoder), merges=merges, end_of_word_suffix="</w>"))
    served.normalizer = normalizers.Sequence(
        [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip(), normalizers.Lowercase()]
    )
    words = Regex(r"'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+")  # SimpleTokenizer's, less its specials
    served.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(words, behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    served.add_special_tokens([start, end])
    served.post_processor = processors.TemplateProcessing(
        single=f"{start} $A {end}", special_tokens=[(start, tokenizer.sot_token_id), (end, tokenizer.eot_token_id)]
    )
    served.decoder = decoders.ByteLevel()
    return served.to_str().encode()


def _text_tower(
    request: ExportRequest, model: Any, tokenizer: Any, served: TextTokenizer, tower_manifest: TowerManifest
) -> Job:
    """The text tower as an export of its own, the served tokenizer's ids checked against open_clip's."""
    options = request.options
    samples = parity_samples(served.settings)
    rows = encode_samples(served, samples).rows
    example = Example({"input_ids": torch.from_numpy(rows["input_ids"])}, keywords=True)
    dynamic: dict[str, tuple[int, ...]] = {"input_ids": ()}
    signature, wrapped = describe(TextFeatures(model).eval(), example, dynamic)
    manifest = tower_manifest(signature, dynamic)
    manifest["tokenizer"] = served.settings.to_manifest()
    texts = [sample[0] for sample in samples] + list(TOKENIZER_TEXTS)

    def ids_check(out: Path) -> tuple[list[str], list[Check]]:
        (out / TOKENIZER_JSON).write_text(served.tokenizer.to_str())
        ours, theirs = served.encode(texts).rows["input_ids"], tokenizer(texts).numpy()
        differ = [text for text, a, b in zip(texts, ours, theirs, strict=True) if a.tolist() != b.tolist()]
        reason = f"the served ids differ from open_clip's for {differ[0][:40]!r}" if differ else None
        return [TOKENIZER_JSON], [("tokenizer", reason)]

    def write(out: Path) -> int:
        own = OwnChecks("text", ids_check)
        formats, tol = options.write.formats, tolerance_of(options)
        return write_tensor_export(wrapped, example, dynamic, formats, request.device, tol, manifest, out, own)

    return Job(manifest, write, "the text tower")


def open_clip_reference(
    checkpoint: OpenClipCheckpoint, preprocess: dict[str, Any], settings: ImageTextSettings, tol: Tolerance
) -> Reference:
    """open_clip's own load of the checkpoint and its calls, against the written towers as the service runs them."""
    call = (
        "open_clip.create_model_and_transforms(name, pretrained=weights): encode_image(transform(image)), "
        "encode_text(tokenizer(texts)), (logit_scale.exp() * unit image @ unit text.T).softmax over labels"
    )

    def checks(photos: list[Image.Image], out: Path) -> list[Check]:
        library, transform, tokenizer = build_open_clip(checkpoint, load=True)
        text_settings = TokenizerSettings.from_manifest(read_manifest_unchecked(out / "text")["tokenizer"])
        served_tokenizer = TextTokenizer((out / "text" / TOKENIZER_JSON).read_bytes(), text_settings)
        texts = [*SENTENCES, *(settings.hypothesis_template.format(label) for label in ZERO_SHOT_LABELS)]
        served_pixels = Preprocessor.from_manifest(preprocess, max_pixels=1 << 40)
        ours_images = ServedModel(out / "image")(
            {"pixel_values": np.stack([served_pixels(p) for p in photos]).astype(np.float32)}
        )
        ours_texts = ServedModel(out / "text")(served_tokenizer.encode(texts).rows)
        with torch.inference_mode():
            theirs_images = library.encode_image(torch.stack([transform(p) for p in photos])).numpy()
            theirs_texts = library.encode_text(tokenizer(texts)).numpy()
            hypotheses = torch.from_numpy(theirs_texts[len(SENTENCES) :])
            unit_images = torch.nn.functional.normalize(torch.from_numpy(theirs_images), dim=-1)
            logits = library.logit_scale.exp() * unit_images @ torch.nn.functional.normalize(hypotheses, dim=-1).T
            if getattr(library, "logit_bias", None) is not None:
                logits = logits + library.logit_bias
            theirs_scores = (logits.sigmoid() if settings.scores == "sigmoid" else logits.softmax(-1)).numpy()
        found: list[Check] = []
        for name, ours, theirs in (("image", ours_images, theirs_images), ("text", ours_texts, theirs_texts)):
            gap = float(np.abs(ours - theirs).max())
            failed = gap > tol.atol + tol.rtol * float(np.abs(theirs).max())
            found.append((f"encode_{name}", f"the served embeddings differ by {gap:.2e}" if failed else None))
        ours_scores = settings.zero_shot(ours_images, ours_texts[len(SENTENCES) :])
        worst = float(np.abs(ours_scores - theirs_scores).max())
        failed = worst > tol.atol + tol.rtol
        found.append(("zero-shot logits", f"the served scores differ by {worst:.2e}" if failed else None))
        return found

    return Reference("open_clip_torch", call, checks)
