"""Text generation: a causal language model (`*ForCausalLM`, as Trainer's checkpoint or a save_pretrained folder, or
with --hf-config a DDP state_dict, an Accelerate or a DCP folder: only the model's keys are read) exported as
- `hf/`: the consolidated Hugging Face folder (weights as loaded, in the checkpoint's dtype; config, generation
  config, tokenizer, chat template), which a user keeps and which vLLM serves on a GPU host;
- `genai/`: the ONNX Runtime GenAI model built from that folder (export/genai_model.py), which the service runs;
- the manifest's `generation` (contract/generation.py): context length, eos and bos ids, whether the tokenizer adds
  bos, the chat template and its hash, the token that ends an assistant's turn.

Refused in one line each: an architecture the builder does not build, remote code without --trust-remote-code,
a quantized checkpoint, no tokenizer, no eos id, a chat template whose turn does not end with an eos id (the model
would never stop). Parity (export/generation_parity.py) compares greedy generations, logits and the served
tokenizer with transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from contract.generation import (
    GENAI_FOLDER,
    GENAI_INT4_FOLDER,
    GENERATION_TEMPLATE_SCRATCH,
    TOKENIZER,
    GenerationSettings,
    PromptTokenizer,
)
from contract.manifest import Manifest, new_tensor_manifest
from contract.signature import TASK_TEXT_GENERATION, Signature, TensorSpec
from export.genai_model import (
    GENAI_ARCHITECTURES,
    build_genai,
    checkpoint_dtype,
    genai_precision,
    write_hf_folder,
)
from export.generation_config import GenerationConfigRead, read_generation_config
from export.generation_parity import Prompt, compare_generation, decode_check, parity_prompts
from export.hf_text import load_hf_text, training_tokenizer
from export.int4_gate import judge, measure
from export.job import Job, log_loading, origin_fields
from export.parity import pin_precision
from export.pipeline import (
    ExportRequest,
    ExportTask,
    add_own_checks,
    close_manifest,
    tolerance_of,
)
from export.readers.hf_checkpoint import CONFIG
from export.reference import Reference
from export.steps import timed

# ONNX Runtime GenAI's build of these attends to the whole context, not to the sliding window their config names (a
# Mistral with a window of 8 answers a 9-token prompt as full attention does, 0.07 from transformers' logits; a prompt
# of 8, exactly): their context is served up to the window, where the two are one. Gemma 2's local layers are built
# with theirs (parity's chats pass a window of 8).
WHOLE_CONTEXT_BUILDS = frozenset({"MistralForCausalLM"})
GENERATE_CALL = "model.generate(ids, generation_config=the folder's generation_config.json, do_sample=False)"


def generation_job(request: ExportRequest) -> Job:
    options, hf = request.options, request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    where = hf.config_dir / CONFIG
    if hf.architecture not in GENAI_ARCHITECTURES:
        raise ValueError(
            f"{where}: {hf.architecture} is a language model that ONNX Runtime GenAI's builder does not build; "
            f"handoff exports {', '.join(GENAI_ARCHITECTURES)}"
        )
    if 0 in (hf.config.get("no_rope_layers") or []):  # SmolLM3's every 4th layer: the builder fails on it
        raise ValueError(
            f"{where}: {hf.architecture} has layers without rotary positions (no_rope_layers), which "
            "onnxruntime-genai's builder does not build yet"
        )
    if hf.config.get("quantization_config"):
        method = hf.config["quantization_config"].get("quant_method", "?")
        raise ValueError(f"{where}: a quantized checkpoint ({method}); handoff exports unquantized weights until tried")
    loaded = load_hf_text(request, hf, "AutoModelForCausalLM")
    tokenizer = training_tokenizer(request, hf, loaded, "language model")
    read = read_generation_config(hf.config_dir, loaded.model)
    settings = generation_settings(tokenizer, loaded.model, read, where)
    dtype = checkpoint_dtype(loaded.src.state_dict)
    log_loading(loaded.src, loaded.unwrapped)
    vocab = int(loaded.model.config.vocab_size)
    signature = Signature(  # the decoder's first call, for /info: token ids in, each position's logits out
        (TensorSpec("input_ids", "int64", (-1, -1)),), (TensorSpec("logits", "float32", (-1, -1, vocab)),)
    )
    origin = origin_fields(hf.weights, loaded.src, loaded.unwrapped, loaded.provenance)
    manifest = new_tensor_manifest(hf.architecture, signature, {"input_ids": [1]}, origin, request.timings)
    manifest |= {
        "task": TASK_TEXT_GENERATION,
        "generation": settings.to_manifest(),
        "generation_config": read.to_manifest(),
        "reference": Reference("transformers", GENERATE_CALL).to_manifest(),
        "hf": {"model_type": hf.config["model_type"], "architecture": hf.architecture, "dtype": str(dtype)[6:]},
    }
    own_prompts = _own_prompts(options.parity.prompts)

    def write(out: Path) -> int:
        with timed(manifest["timings"], "hf folder"):
            files = write_hf_folder(loaded.model, tokenizer, read.config, dtype, out)
        with timed(manifest["timings"], "genai"):
            files += build_genai(out, request.device.type)
        manifest["genai"] = {"folder": GENAI_FOLDER, "precision": genai_precision(request.device.type)}
        with timed(manifest["timings"], "parity"):
            manifest["parity"], prompts = _parity(out, loaded.model, read, tokenizer, settings, own_prompts, request)
        if options.parity.int4 and manifest["parity"]["pass"]:
            with timed(manifest["timings"], "int4"):
                files += _int4(out, manifest, [p.ids for p in prompts], list(settings.eos_token_ids), request)
        return close_manifest(manifest, out, files)

    template = "with its chat template" if settings.chat_template else "without a chat template (completions only)"
    return Job(manifest, write, f"{hf.architecture} ({vocab} tokens, context {settings.context_length}) {template}")


def generation_settings(tokenizer: Any, model: Any, read: GenerationConfigRead, where: Path) -> GenerationSettings:
    """What the service needs to answer as transformers does; ValueError for a model that could never stop."""
    generation_config = read.config
    eos = generation_config.eos_token_id if generation_config.eos_token_id is not None else tokenizer.eos_token_id
    eos_ids = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if not eos_ids:
        raise ValueError(
            f"{where}: no eos token id (generation_config.json, config.json or the tokenizer): "
            "generation would never stop"
        )
    bos = tokenizer.bos_token_id
    adds_bos = bos is not None and tokenizer("x")["input_ids"][:1] == [bos]
    tokens = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    context = int(getattr(model.config, "max_position_embeddings", 0) or tokenizer.model_max_length)
    window = getattr(model.config, "sliding_window", None)
    if type(model).__name__ in WHOLE_CONTEXT_BUILDS and window and int(window) < context:
        context = int(window)  # past the window the served model would attend where transformers' does not
    settings = GenerationSettings(
        context,
        tuple(int(i) for i in eos_ids),
        bos,
        adds_bos,
        tokenizer.chat_template,
        tokens,
        repetition_penalty=read.repetition_penalty,
        request_defaults={k: float(v) for k, v in read.request_defaults.items()},
    )
    if settings.chat_template is None:
        return settings
    turn_end = _turn_end(tokenizer)
    if turn_end not in eos_ids:
        name = tokenizer.convert_ids_to_tokens(turn_end) if turn_end is not None else "(nothing)"
        raise ValueError(
            f"{where}: the chat template ends an assistant's turn with {name!r} (id {turn_end}), which is not one of "
            f"the eos ids {list(eos_ids)}: the served model would not stop at the end of its turn; add it to "
            "generation_config.json's eos_token_id"
        )
    return GenerationSettings(**{**settings.__dict__, "turn_end_token_id": turn_end})


def _turn_end(tokenizer: Any) -> int | None:
    """The first token the template writes after an assistant's reply."""
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": GENERATION_TEMPLATE_SCRATCH}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    at = text.rfind(GENERATION_TEMPLATE_SCRATCH)
    after = (
        tokenizer(text[at + len(GENERATION_TEMPLATE_SCRATCH) :], add_special_tokens=False)["input_ids"]
        if at >= 0
        else []
    )
    return int(after[0]) if after else None


def _own_prompts(path: Path | None) -> list[Any]:
    if path is None:
        return []
    try:
        prompts = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"--prompts {path}: cannot be read as JSON ({err})") from None
    ok = isinstance(prompts, list) and all(
        isinstance(p, str)
        or (isinstance(p, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in p))
        for p in prompts
    )
    if not ok:
        raise ValueError(f'--prompts {path}: expected a list of strings and of [{{"role", "content"}}, ...] chats')
    return prompts


def _int4(out: Path, manifest: Manifest, prompts: list[list[int]], eos: list[int], request: ExportRequest) -> list[str]:
    """The int4 GenAI model built beside the proved one and held to the accuracy gate (export/int4_gate.py) on the
    parity prompts: served in its place where it holds it (its files returned), else removed, the export failed with
    by how much it missed."""
    files = build_genai(out, request.device.type, int4=True)
    gate = request.options.parity.int4_gate
    measured = measure(out / GENAI_FOLDER, out / GENAI_INT4_FOLDER, prompts, request.options.parity.new_tokens, eos)
    report = judge(measured, gate)
    manifest["parity"]["summary"].append(f"  {report.line()}")
    proved = {"folder": manifest["genai"]["folder"], "precision": manifest["genai"]["precision"]}
    add_own_checks(manifest["parity"], "int4_gate", [("int4 gate", report.reason)])
    if not report.passed:  # the int4 model is not written; the proved one stays named, the export failed
        shutil.rmtree(out / GENAI_INT4_FOLDER)
        manifest["genai"]["gate"] = report.to_manifest(gate)
        return []
    manifest["genai"] = {"folder": GENAI_INT4_FOLDER, "precision": "int4", "gate": report.to_manifest(gate)}
    manifest["genai"]["proved"] = proved
    return files


def _parity(
    out: Path,
    model: Any,
    read: GenerationConfigRead,
    tokenizer: Any,
    settings: GenerationSettings,
    own: list[Any],
    request: ExportRequest,
) -> tuple[dict[str, Any], list[Prompt]]:
    """The parity block: the served tokenizer's checks, then greedy generations and logits against transformers'
    `generate` with the folder's generation config; and the prompts it ran."""
    precision = genai_precision(request.device.type)
    tol = tolerance_of(request.options, precision)
    served = PromptTokenizer((out / TOKENIZER).read_bytes(), settings)
    prompts, checks = parity_prompts(tokenizer, served, own)
    checks.append(decode_check(tokenizer, served, prompts))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else settings.eos_token_ids[0]
    generated, generation_checks = compare_generation(
        model,
        read.config,
        out / GENAI_FOLDER,
        prompts,
        list(settings.eos_token_ids),
        pad,
        request.options.parity.new_tokens,
        tol,
    )
    checks += generation_checks
    passed = all(reason is None for _, reason in checks) and generated.tokens_compared > 0
    report: dict[str, Any] = {
        "summary": [
            f"parity: ONNX Runtime GenAI against transformers on {request.device}, {len(prompts)} prompts, "
            f"{request.options.parity.new_tokens} new tokens each (to eos, and forced past it): "
            f"{generated.tokens_compared} "
            f"tokens compared, {generated.near_ties} near-tie(s), logits within {generated.max_logit_diff:.1e}"
        ],
        "device": str(request.device),
        "precision": {"policy": f"{precision} GenAI model vs fp32 eager", **pin_precision()},
        "tolerance": {"atol": tol.atol, "rtol": tol.rtol},
        "generation": generated.__dict__,
        "not_checked": None if generated.tokens_compared else "no token was generated to compare",
        "pass": passed if generated.tokens_compared else None,
    }
    add_own_checks(report, "generation_checks", checks)
    return report, prompts


TASK = ExportTask(
    TASK_TEXT_GENERATION,
    "language models",
    generation_job,
    frozenset({"prompts", "new_tokens", "int4", "int4_min_agreement", "int4_max_loglik_drop"}),
)
