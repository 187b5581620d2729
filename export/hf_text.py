"""What the Hugging Face text tasks share (export/tasks/text_classification.py, text_embedding.py): the model built
from its config with every tensor from the checkpoint, the training tokenizer and its settings for the service, the
texts parity runs on, and a text model's own checks.

The model is called with the token inputs its tokenizer makes (`input_ids`, `attention_mask`, and
`token_type_ids` where the tokenizer gives them). Its example is what the tokenizer makes of real texts of every
length it can take, padded to the longest: the shortest (one word), sentences of several lengths, and one past the
model's maximum length (truncated to it), so the tensor export's parity (export/tensor_parity.py: 1, 2 and all rows,
the sequence cut short) runs on real token ids at both extremes and on a batch of mixed lengths. Two checks are a
text model's own:
- the served tokenizer (contract/tokenizer_spec.py, the `tokenizers` library) gives the very ids the training
  tokenizer (transformers) gives, truncation included (for a pair model, on pairs: short and long on either side,
  and both past the maximum);
- padding is exact: each text's outputs in the padded batch equal its outputs alone, in every artifact.
The tokenizer's files and the model's config.json are copied into the export and hashed in the manifest.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from tokenizers import Tokenizer

from contract.manifest import Manifest, Origin, new_tensor_manifest
from contract.tokenizer_spec import MASK, TOKENIZER_JSON, Encoded, TextTokenizer, TokenizerSettings, pad_to_longest
from export.hf_tokenizer import SENTENCES, load_tokenizer, tokenizer_settings
from export.job import Job, log_loading, origin_fields
from export.options import ExportOptions
from export.parity import onnx_sessions
from export.pipeline import Check, ExportRequest, OwnChecks, library_checks, tolerance_of, write_tensor_export
from export.provenance import Provenance, load_checked, trace
from export.readers import Source, read_source
from export.readers.hf_checkpoint import CONFIG, HfCheckpoint, tokenizer_folder
from export.readers.lora import Adapter, merge, read_adapter, stored_transposed
from export.steps import timed
from export.tensor_model import Example, describe
from export.unwrap import Unwrapped, unwrap_keys
from train.class_names import check_class_names

SHORTEST = "Ok"  # one word: the fewest tokens a text gives (the special tokens around it)
TOKENIZER_COPIES = ("tokenizer_config.json", "special_tokens_map.json")


class Logits(nn.Module):
    """A transformers classifier called with token inputs by name, giving its logits alone."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.model(**inputs, return_dict=True).logits}


@dataclass(frozen=True)
class LoadedText:
    """A Hugging Face text model read from its checkpoint: the model, where its weights came from, and how."""

    model: Any
    src: Source
    unwrapped: Unwrapped
    provenance: Provenance

    def origin(self, hf: HfCheckpoint) -> Origin:
        """The manifest's `source` and `provenance` of this model (export/job.py)."""
        return origin_fields(hf.weights, self.src, self.unwrapped, self.provenance)


def load_hf_text(
    request: ExportRequest, hf: HfCheckpoint, auto_class: str, fit: Callable[[Any, set[str]], None] | None = None
) -> LoadedText:
    """The checkpoint's weights read (`hf.weights`) and loaded into the model `auto_class` builds from the config;
    `fit(model, keys)` may first drop a part of the model the task does not use and the checkpoint does not hold."""
    options = request.options
    with timed(request.timings, "load"):
        src = read_source(hf.weights, trust_pickle=options.read.trust_pickle, ema=options.read.ema)
        if hf.weights == hf.config_dir:  # Trainer's checkpoint-N or a save_pretrained folder
            src.kind = "transformers"
        adapter = read_adapter(hf.adapter) if hf.adapter is not None else None
        model, unwrapped, provenance = build_hf_model(
            hf, src.state_dict, auto_class, options.read.trust_remote_code, options.read.allow_partial, fit, adapter
        )
        if adapter is not None:
            provenance.adapter = adapter.to_manifest()
    return LoadedText(model, src, unwrapped, provenance)


def build_hf_model(
    hf: HfCheckpoint,
    state: dict[str, torch.Tensor],
    auto_class: str,
    trust_remote_code: bool,
    allow_partial: bool = False,
    fit: Callable[[Any, set[str]], None] | None = None,
    adapter: Adapter | None = None,
) -> tuple[Any, Unwrapped, Provenance]:
    """The model the config describes, with every one of its tensors from the checkpoint (wrapper prefixes removed;
    tied weights only where the model declares them) and `adapter` merged in as PEFT merges it into this model's
    layers, and its provenance (export/provenance.py)."""
    import transformers

    transformers.logging.set_verbosity_error()  # its notes about training (the loss it would use) are not ours
    if "auto_map" in hf.config and not trust_remote_code:
        raise ValueError(
            f"{hf.config_dir / CONFIG} needs the model's own code (auto_map), which would run code from that folder; "
            "add --trust-remote-code if you trust it"
        )
    config = transformers.AutoConfig.from_pretrained(
        hf.config_dir, trust_remote_code=trust_remote_code, local_files_only=True
    )
    model = getattr(transformers, auto_class).from_config(config, trust_remote_code=trust_remote_code)
    if adapter is not None:
        state = merge(adapter, state, stored_transposed(model))
    state, renamed = renamed_on_load(model, state)
    if fit is not None:
        fit(model, set(unwrap_keys(state, set(model.state_dict())).state_dict))
    unwrapped = unwrap_keys(state, set(model.state_dict()))
    if renamed:
        unwrapped.removed.append(f"{renamed} keys renamed as transformers renames them on load")
    what = f"{hf.architecture} (as {hf.config_dir / CONFIG} describes it)"
    loaded, tied = load_checked(model, unwrapped, what, allow_partial)
    model = model.float().eval()
    return model, unwrapped, trace(model, unwrapped, loaded, tied, what, allow_partial)


def renamed_on_load(model: Any, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """The checkpoint's keys as transformers names them when it loads this model (its checkpoint conversion mapping:
    a ViT saved as `vit.encoder.layer.0.attention.attention.query` is loaded as `vit.layers.0.attention.q_proj`),
    and how many were renamed. Only renamings: a mapping that fuses or splits tensors is refused until tried, since
    each served tensor must be one of the checkpoint's (export/provenance.py)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, apply_renamings

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    own = set(model.state_dict())
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        new = key if key in own else apply_renamings(key, renamings)
        if any(converter.rename_source_key(new)[1] is not None for converter in converters):
            raise ValueError(f"{key}: transformers converts this tensor on load (fuses or splits it), until tried")
        if new in out:
            raise ValueError(f"{key}: renamed as transformers renames it, it collides with another tensor ({new})")
        out[new] = tensor
    return out, sum(1 for key in state if key not in out)


def training_tokenizer(request: ExportRequest, hf: HfCheckpoint, loaded: LoadedText, what: str | None) -> Any:
    """The tokenizer the model was trained with (--tokenizer, else beside the config or the weights). None where there
    is none and `what` is None; else ValueError saying that `what` is served on texts."""
    folder = tokenizer_folder(hf, request.options.read.tokenizer)
    if folder is None:
        if what is None:
            return None
        raise ValueError(
            f"{hf.config_dir}: no tokenizer beside the {what} (tokenizer.json or tokenizer_config.json); it is "
            "served on texts: --tokenizer DIR names its tokenizer"
        )
    text_config = getattr(loaded.model.config, "text_config", loaded.model.config)  # an image-text model's text tower
    return load_tokenizer(folder, request.options.read.trust_remote_code, int(text_config.vocab_size))


def config_labels(hf: HfCheckpoint, config: Any) -> list[str]:
    """The class names of the config's `id2label`, in index order, through the class-name checks."""
    names = [config.id2label.get(i, i) for i in range(config.num_labels)]
    return check_class_names(names, f"{hf.config_dir / CONFIG}: id2label")


def pipeline_scores(config: Any) -> str:
    """How transformers' text-classification pipeline scores this classifier's logits (the manifest's `scores`):
    none for a regression head, sigmoid for independent labels or one, softmax for one label of several."""
    if config.problem_type == "regression":
        return "none"
    if config.problem_type == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    return "softmax"


def hf_manifest(
    hf: HfCheckpoint,
    signature: Any,
    dynamic: dict[str, tuple[int, ...]],
    src: Any,
    unwrapped: Unwrapped,
    provenance: Provenance,
    timings: dict[str, float],
) -> Manifest:
    """The manifest of any model, for this Hugging Face checkpoint (a text model adds its own fields)."""
    origin = origin_fields(hf.weights, src, unwrapped, provenance)
    return new_tensor_manifest(hf.architecture, signature, {n: list(d) for n, d in dynamic.items()}, origin, timings)


Sample = tuple[str, ...]  # what one row is made of: a text, or a pair of texts


def parity_samples(settings: TokenizerSettings) -> list[Sample]:
    """The shortest text, the sentences, and one past the model's maximum length (truncation is checked too); for
    a model that takes pairs, pairs of them (after the single texts where it takes those too): short and long on
    either side, and two past the maximum (tokenized whole where the budget is odd, contract/tokenizer_spec.py)."""
    long = " ".join(SENTENCES * (settings.max_length // 8 + 1))
    singles: list[Sample] = [] if settings.pairs else [(text,) for text in (SHORTEST, *SENTENCES, long)]
    if not settings.any_pairs:
        return singles
    turned = zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1], strict=True)
    return [*singles, (SHORTEST, SHORTEST), *turned, (long, SHORTEST), (SHORTEST, long), (long[: len(long) // 2], long)]


def encode_samples(served: TextTokenizer, samples: list[Sample]) -> Encoded:
    """The samples as the service tokenizes them, in one padded batch: the single texts (first), then the pairs."""
    singles = [sample[0] for sample in samples if len(sample) == 1]
    pairs = [(sample[0], sample[1]) for sample in samples if len(sample) == 2]
    assert [len(s) for s in samples] == [1] * len(singles) + [2] * len(pairs), "single texts first, then pairs"
    parts = ([served.encode(singles)] if singles else []) + ([served.encode_pairs(pairs)] if pairs else [])
    if len(parts) == 1:
        return parts[0]
    rows = pad_to_longest([part.rows for part in parts], served.settings)
    return Encoded(rows, [t for part in parts for t in part.truncated], [s for part in parts for s in part.spans])


def tokenized_job(
    request: ExportRequest,
    hf: HfCheckpoint,
    loaded: LoadedText,
    tokenizer: Any,
    wrapper: nn.Module,
    fields: Manifest,
    described: str,
    pairs: bool = False,
    reference: Callable[[TextTokenizer, Path], list[Check]] | None = None,
    takes_pairs: bool = False,
) -> Job:
    """The export of a text model that takes what `tokenizer` makes (of pairs of texts only, with `pairs`; of single
    texts and pairs alike, with `takes_pairs`): `wrapper`
    (the model, giving its outputs by name) described and proved on the parity samples, the task's manifest
    `fields` added, the tokenizer checked and copied into the export; `reference(served, out)`: the task's
    comparison of the written export with the user's library (export/reference.py)."""
    options, device = request.options, request.device
    settings = tokenizer_settings(tokenizer, loaded.model.config, pairs, takes_pairs)
    served = TextTokenizer(tokenizer.backend_tokenizer.to_str().encode(), settings)
    samples = parity_samples(settings)
    example = Example({n: torch.from_numpy(a) for n, a in encode_samples(served, samples).rows.items()}, keywords=True)
    dynamic: dict[str, tuple[int, ...]] = {name: (1,) for name in settings.inputs}
    signature, wrapped = describe(wrapper, example, dynamic)
    log_loading(loaded.src, loaded.unwrapped)
    manifest = hf_manifest(hf, signature, dynamic, loaded.src, loaded.unwrapped, loaded.provenance, request.timings)
    manifest |= fields
    manifest["tokenizer"] = settings.to_manifest()
    manifest["hf"] = {"model_type": hf.config["model_type"], "architecture": hf.architecture, "config": CONFIG}

    def text_checks(out: Path) -> tuple[list[str], list[Check]]:
        copied = copy_tokenizer(tokenizer, loaded.model, out)
        checks = [same_ids(tokenizer, served, samples), *padding_is_exact(served, samples, out, device, options)]
        compared = library_checks(lambda: reference(served, out)) if reference is not None else []
        return copied, checks + compared

    def write(out: Path) -> int:
        own = OwnChecks("text", text_checks)
        formats, tol = request.options.write.formats, tolerance_of(options)
        return write_tensor_export(wrapped, example, dynamic, formats, device, tol, manifest, out, own)

    return Job(manifest, write, described)


def copy_tokenizer(tokenizer: Any, model: Any, out: Path) -> list[str]:
    """The served tokenizer.json (with no padding or truncation of its own: the manifest says those), the training
    tokenizer's other files and the model's config, into the export."""
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer.save_pretrained(scratch)
        copied = [name for name in TOKENIZER_COPIES if (Path(scratch) / name).is_file()]
        for name in copied:
            shutil.copyfile(Path(scratch) / name, out / name)
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())  # a copy: the training tokenizer stays as is
    backend.no_padding()
    backend.no_truncation()
    (out / TOKENIZER_JSON).write_text(backend.to_str())
    model.config.to_json_file(out / CONFIG)
    return [TOKENIZER_JSON, *copied, CONFIG]


def same_ids(tokenizer: Any, served: TextTokenizer, samples: list[Sample]) -> tuple[str, str | None]:
    """The served tokenizer against the training one, on every parity sample (past the maximum length too): ids
    and, where the model takes them, segment ids."""
    encoded = encode_samples(served, samples)
    for row, sample in enumerate(samples):
        theirs = tokenizer(*sample, truncation=True, max_length=served.settings.max_length, return_token_type_ids=True)
        kept = encoded.rows[MASK][row] == 1
        for name in ("input_ids", "token_type_ids"):
            if name in encoded.rows and encoded.rows[name][row][kept].tolist() != list(theirs[name]):
                shown = " / ".join(text[:30] for text in sample)
                return "tokenizer", f"the served tokenizer's {name} differ from transformers' for {shown!r}"
    return "tokenizer", None


def padding_is_exact(
    served: TextTokenizer, samples: list[Sample], out: Path, device: torch.device, options: ExportOptions
) -> list[tuple[str, str | None]]:
    """In each ONNX session: every sample's first output in the padded batch against its output alone."""
    tol = tolerance_of(options)
    batch = encode_samples(served, samples).rows
    checks = []
    for provider, _, session in onnx_sessions(out / "model.onnx", device):
        names = [i.name for i in session.get_inputs()]
        together = session.run(None, {n: batch[n] for n in names})[0]
        worst = 0.0
        for row, sample in enumerate(samples):
            alone_rows = encode_samples(served, [sample]).rows
            alone = session.run(None, {n: a for n, a in alone_rows.items() if n in names})[0][0]
            mine = _own_tokens(together[row], alone.shape, served.settings.padding_side)
            worst = max(worst, float(np.abs(mine - alone).max()))
        scale = float(np.abs(together).max())
        failed = worst > tol.atol + tol.rtol * scale
        checks.append(
            (f"padding ({provider})", f"a padded row differs from the text alone by {worst:.2e}" if failed else None)
        )
    return checks


def _own_tokens(padded: np.ndarray, shape: tuple[int, ...], side: str) -> np.ndarray:
    """A row of a padded batch's output cut to the text's own (a token model's outputs follow the padding)."""
    if side == "left":
        return padded[tuple(slice(m - n, m) for m, n in zip(padded.shape, shape, strict=True))]
    return padded[tuple(slice(0, n) for n in shape)]
