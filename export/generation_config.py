"""A language model's `generation_config.json`, every setting accounted for: what `generate()` does with it is either
done by the service and its parity too, shown not to change a greedy answer, or refused in one line.

Read as transformers reads it (`GenerationConfig.from_pretrained`), only what differs from transformers' defaults
matters (`to_diff_dict`). Each such setting is one of:
- `HONOURED`: the eos ids (the service stops there); `repetition_penalty`, applied by ONNX Runtime GenAI as
  transformers applies it, in parity (transformers' `generate` with the folder's config, greedy) and when serving;
- `REQUEST_DEFAULTS`: `temperature`, `top_p`, `top_k` and `max_new_tokens`, what a request that leaves them out
  gets, as vLLM's OpenAI server takes them from the folder (`--generation-config auto`); `do_sample` is left to the
  request's temperature, as there. A greedy parity does not sample, so none of them changes what it compares;
- `WITHOUT_EFFECT`: bookkeeping (the release that wrote it, the cache, what `generate` returns);
and anything else (`no_repeat_ngram_size`, `bad_words_ids`, forced or suppressed tokens, beams, `min_p`, ...) is
refused, since the served model would answer as no user of that checkpoint gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENERATION_CONFIG = "generation_config.json"
HONOURED = {"eos_token_id", "repetition_penalty"}
REQUEST_DEFAULTS = {"temperature", "top_p", "top_k", "max_new_tokens"}
WITHOUT_EFFECT = {
    "transformers_version", "_from_model_config", "bos_token_id", "pad_token_id", "decoder_start_token_id",
    "use_cache", "cache_implementation", "return_dict_in_generate", "output_scores", "output_logits",
    "output_attentions", "output_hidden_states", "do_sample",  # the request's temperature decides, as in vLLM
    "max_length",  # replaced by the context or max_tokens: the service never stops at transformers' default 20
}  # fmt: skip
# Settings that are neutral at these values whatever the rest says (a beam search's length penalty with one beam)
NEUTRAL_WITH = {"length_penalty": ("num_beams", 1), "early_stopping": ("num_beams", 1)}
MAX_REPETITION_PENALTY = 2.0


@dataclass(frozen=True)
class GenerationConfigRead:
    """The folder's generation config and what the service applies of it."""

    config: Any  # transformers.GenerationConfig, passed to generate() in parity
    repetition_penalty: float = 1.0
    request_defaults: dict[str, float | int] = field(default_factory=dict)
    accounted: dict[str, str] = field(default_factory=dict)  # each setting that differs from the default: what of it

    def to_manifest(self) -> dict[str, Any]:
        return {
            "file": GENERATION_CONFIG,
            "repetition_penalty": self.repetition_penalty,
            "request_defaults": self.request_defaults,
            "settings": self.accounted,
        }


def read_generation_config(folder: Path, model: Any) -> GenerationConfigRead:
    """The folder's generation_config.json (else the one transformers makes from the model's config), each setting
    accounted for; ValueError naming the ones the service would not apply."""
    import transformers

    where = folder / GENERATION_CONFIG
    if where.is_file():
        config = transformers.GenerationConfig.from_pretrained(folder, local_files_only=True)
    else:
        config = transformers.GenerationConfig.from_model_config(model.config)
    changed = config.to_diff_dict()
    accounted: dict[str, str] = {}
    refused = []
    for key, value in changed.items():
        neutral = NEUTRAL_WITH.get(key)
        if key in HONOURED:
            accounted[key] = "honoured: served and in parity"
        elif key in REQUEST_DEFAULTS:
            accounted[key] = "a request's default, as vLLM takes it"
        elif key in WITHOUT_EFFECT or (neutral is not None and changed.get(neutral[0], 1) == neutral[1]):
            accounted[key] = "changes no answer"
        elif value is not None:
            refused.append(f"{key}={value!r}")
    if refused:
        raise ValueError(
            f"{where}: {', '.join(refused)}: generate() applies {'it' if len(refused) == 1 else 'them'} and the "
            "service would not; remove them or generate with transformers"
        )
    penalty = float(config.repetition_penalty or 1.0)
    if not 0 < penalty <= MAX_REPETITION_PENALTY:
        raise ValueError(f"{where}: repetition_penalty {penalty}: handoff serves 0 to {MAX_REPETITION_PENALTY}")
    defaults = {key: changed[key] for key in sorted(REQUEST_DEFAULTS) if changed.get(key) is not None}
    return GenerationConfigRead(config, penalty, defaults, accounted)
