"""Parity that means something for generation: the exported GenAI model against the checkpoint's model in
transformers, on prompts through the chat template and raw completions.

For each prompt:
- greedy ids over `new_tokens` tokens, once stopping at eos and once forced past it (eos masked until the end,
  `min_new_tokens`), equal to transformers' `generate(do_sample=False)`; where the two first differ, the step must be
  a near-tie (each side's token in the other's top 5, vLLM's rule for comparing two implementations) and the rest of
  that sequence is not compared (it continues from different tokens); the report counts such steps;
- the logits at every generated step (teacher-forced on eager's tokens) within the tolerance;
- each token the GenAI model chose is the best of its own logits as the folder's generation config scores them
  (`generate` with `generation_config.json`: its repetition penalty), so a decoder that drops what the folder asks
  for is caught even where the two implementations' choices differ only at a near-tie;
and on every prompt, the served tokenizer and chat-template renderer (contract/generation.py) give transformers'
ids exactly, bos included, and decode its generated ids to transformers' text.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from contract.generation import Message, PromptTokenizer, TemplateError
from export.parity import Tolerance
from export.pipeline import Check

NEAR_TIE_TOP = 5
CHATS: tuple[tuple[str, list[Message]], ...] = (
    ("chat, one short turn", [{"role": "user", "content": "Hi"}]),
    ("chat, a question", [{"role": "user", "content": "What comes after three? Answer in one word, please."}]),
    (
        "chat, a system message",
        [
            {"role": "system", "content": "You are a helpful assistant who answers briefly."},
            {"role": "user", "content": "Name a colour of the sky."},
        ],
    ),
    (
        "chat, several turns",
        [
            {"role": "user", "content": "Count with me."},
            {"role": "assistant", "content": "One, two."},
            {"role": "user", "content": "And then?"},
        ],
    ),
)
COMPLETIONS: tuple[tuple[str, str], ...] = (
    ("completion, one word", "The"),
    ("completion, a sentence", "Once upon a time, in a small village by the sea, there lived"),
)


@dataclass
class Prompt:
    name: str
    ids: list[int]


@dataclass
class GenerationReport:
    """What was compared and what differed, for the manifest's parity report."""

    prompts: int = 0
    tokens_compared: int = 0
    near_ties: int = 0
    max_logit_diff: float = 0.0


def parity_prompts(tokenizer: Any, served: PromptTokenizer, own: list[Any]) -> tuple[list[Prompt], list[Check]]:
    """The prompts parity runs on, as transformers tokenizes them (chats only where the tokenizer has a template;
    `own`: the user's, a string a completion and a list of messages a chat), and whether the served tokenizer gives
    the very same ids for each."""
    chats = list(CHATS) if tokenizer.chat_template else []
    completions = list(COMPLETIONS)
    for i, item in enumerate(own):
        (completions if isinstance(item, str) else chats).append((f"yours #{i + 1}", item))
    prompts: list[Prompt] = []
    checks: list[Check] = []
    for name, messages in chats:
        try:
            ids = list(
                tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            )
        except Exception as err:  # noqa: BLE001 - the template's own refusal (Gemma's: no system role), whatever its type
            checks.append(refused_alike(name, messages, served, err, own=name.startswith("yours")))
            continue
        prompts.append(Prompt(name, ids))
        try:
            mine = served.encode_chat(messages)
        except TemplateError as err:
            checks.append((f"template: {name}", f"the served renderer failed: {err}"))
            continue
        checks.append((f"template: {name}", None if mine == ids else f"served ids {mine[:12]}... != {ids[:12]}..."))
    for name, text in completions:
        ids = list(tokenizer(text)["input_ids"])
        prompts.append(Prompt(name, ids))
        mine = served.encode_prompt(text)
        checks.append((f"tokenizer: {name}", None if mine == ids else f"served ids {mine[:12]} != {ids[:12]}"))
    return prompts, checks


def refused_alike(name: str, messages: list[Message], served: PromptTokenizer, err: Exception, own: bool) -> Check:
    """A chat the template refuses (Gemma's refuses a system role): the served renderer must refuse it too, so that
    such a request is a 400 naming the template's reason; one of the user's own chats refused fails the export."""
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    try:
        served.encode_chat(messages)
    except TemplateError:
        return (f"template refuses: {name}", f"your chat is refused by the chat template: {reason}" if own else None)
    return (f"template: {name}", f"transformers' template refuses it ({reason}), the served renderer does not")


def _eager(
    model: Any, config: Any, ids: list[int], new_tokens: int, forced: bool, eos: list[int], pad: int
) -> tuple[list[int], np.ndarray]:
    """transformers' greedy ids after `ids` with the folder's generation config (its repetition penalty), and the
    raw logits of each step."""
    with torch.no_grad():
        greedy = copy.deepcopy(config)  # the folder's settings, with this comparison's own on top
        greedy.update(
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens if forced else 0,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
        out = model.generate(
            torch.tensor([ids]), generation_config=greedy, attention_mask=torch.ones(1, len(ids), dtype=torch.long)
        )
    tokens = out.sequences[0, len(ids) :].tolist()
    return tokens, torch.stack([step[0] for step in out.logits]).float().numpy()


def _genai(
    model: Any, ids: list[int], new_tokens: int, forced: bool, penalty: float
) -> tuple[list[int], list[np.ndarray]]:
    """The GenAI model's greedy ids after `ids` with the service's repetition penalty, and the logits it chose each
    from (before the penalty, as transformers' `output_logits` gives them)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=len(ids) + new_tokens,
        min_length=len(ids) + (new_tokens if forced else 0),
        do_sample=False,
        repetition_penalty=penalty,
    )
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    tokens, logits = [], []
    while not generator.is_done():
        logits.append(np.array(generator.get_logits()).reshape(-1))
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens, logits


def compare_generation(
    eager: Any,
    config: Any,
    genai_folder: Path,
    prompts: list[Prompt],
    eos: list[int],
    pad: int,
    new_tokens: int,
    tol: Tolerance,
) -> tuple[GenerationReport, list[Check]]:
    """Greedy ids and teacher-forced logits of the GenAI model against eager's `generate` with the folder's
    generation `config`, prompt by prompt, stopping at eos and forced past it."""
    import onnxruntime_genai as og

    model = og.Model(str(genai_folder))
    pick = greedy_scores(config)
    report, checks = GenerationReport(), []
    for prompt in prompts:
        for forced in (False, True):
            name = f"greedy: {prompt.name}{', past eos' if forced else ''}"
            want, want_logits = _eager(eager, config, prompt.ids, new_tokens, forced, eos, pad)
            got, got_logits = _genai(model, prompt.ids, new_tokens, forced, float(config.repetition_penalty or 1.0))
            report.prompts += 1
            reason = _own_choices(prompt.ids, got, got_logits, pick, eos if forced else [], tol)
            checks.append((name, reason or _same_tokens(want, got, want_logits, got_logits, report, tol)))
    return report, checks


def greedy_scores(config: Any) -> Callable[[list[int], np.ndarray], np.ndarray]:
    """What greedy search picks from after `ids`, as transformers makes it from a step's raw logits: the folder's
    logits processors (its repetition penalty, transformers' own processor) applied."""
    import transformers

    penalty = float(config.repetition_penalty or 1.0)
    if penalty == 1.0:
        return lambda ids, logits: logits
    processor = transformers.RepetitionPenaltyLogitsProcessor(penalty)
    return lambda ids, logits: processor(torch.tensor([ids]), torch.from_numpy(logits[None].copy()))[0].numpy()


def _own_choices(
    prompt: list[int],
    got: list[int],
    logits: list[np.ndarray],
    pick: Callable[[list[int], np.ndarray], np.ndarray],
    masked: list[int],
    tol: Tolerance,
) -> str | None:
    """None where each token the GenAI model chose is the best of its own logits as the folder's generation config
    scores them, `masked` ids left out (eos, where generation is forced past it), up to a tie within `tol`: a served
    decoder that drops a processor (the repetition penalty) is caught here, where the near-tie rule between the two
    implementations would let it pass."""
    for step, token in enumerate(got):
        scores = pick(prompt + got[:step], logits[step]).copy()
        scores[masked] = -np.inf
        best = int(np.argmax(scores))
        if token != best and scores[best] - scores[token] > tol.atol + tol.rtol * float(np.abs(scores).max()):
            return (
                f"step {step}: token {token} where the folder's generation config picks {best} from the same logits "
                f"(scores {scores[token]:.3f} and {scores[best]:.3f})"
            )
    return None


def _same_tokens(
    want: list[int],
    got: list[int],
    want_logits: np.ndarray,
    got_logits: list[np.ndarray],
    report: GenerationReport,
    tol: Tolerance,
) -> str | None:
    """None where the GenAI model's tokens are eager's (up to a near-tie) with logits within `tol`; else why not."""
    for step, token in enumerate(want):
        if step >= len(got):
            return f"stopped after {len(got)} tokens where transformers generated {len(want)}: {got} vs {want}"
        mine, theirs = got_logits[step], want_logits[step]
        diff = float(np.abs(mine - theirs).max())
        report.max_logit_diff = max(report.max_logit_diff, diff)
        if diff > tol.atol + tol.rtol * float(np.abs(theirs).max()):
            return f"step {step}: logits differ by {diff:.2e} (atol {tol.atol:g}, rtol {tol.rtol:g})"
        report.tokens_compared += 1
        if got[step] != token:
            top_theirs = set(np.argsort(-theirs)[:NEAR_TIE_TOP].tolist())
            top_mine = set(np.argsort(-mine)[:NEAR_TIE_TOP].tolist())
            if got[step] in top_theirs and token in top_mine:
                report.near_ties += 1
                return None  # the sequences go on from different tokens: nothing after this compares
            return f"step {step}: token {got[step]} where transformers chose {token}, not a near-tie"
    if len(got) != len(want):
        return f"generated {len(got)} tokens where transformers generated {len(want)}"
    return None


def decode_check(tokenizer: Any, served: PromptTokenizer, prompts: list[Prompt]) -> Check:
    """The served decoder gives transformers' text for each prompt's ids, special tokens skipped."""
    for prompt in prompts:
        want = tokenizer.decode(prompt.ids, skip_special_tokens=True)
        if served.decode(prompt.ids) != want:
            return ("decode", f"{prompt.name}: served text {served.decode(prompt.ids)[:40]!r} != {want[:40]!r}")
    return ("decode", None)
