"""The language-model families people fine-tune, end to end: a tiny Qwen2, Qwen3, Phi-3, Gemma 2 and Mistral, each
with its family's special tokens, chat template and config settings (harness/chat_families.py), fine-tuned by Trainer
under torchrun (2 gloo processes) and exported with no flags, parity passed (greedy ids equal to transformers'
`generate` with the folder's generation config, chat rendering and tokenizer ids exact); Gemma's template refuses a
system role, so parity's system chat is refused alike and a request with one is a 400 in OpenAI's body; SmolLM3's
no-RoPE layers, which the builder cannot build, are refused in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import torch
import transformers
from conftest import Server, run

from contract.manifest import read_manifest_unchecked
from harness.chat_families import FAMILIES

pytestmark = pytest.mark.xdist_group("families")

BUILT = ("qwen2", "qwen3", "phi3", "gemma2", "mistral")


@pytest.mark.parametrize("name", BUILT)
def test_each_family_exports_with_no_flags_and_passes_parity(families_run: Path, name: str):
    checkpoint = families_run / name / "checkpoint-20"
    manifest = read_manifest_unchecked(checkpoint.with_suffix(".export"))
    assert manifest["status"] == "passed", manifest["parity"]["summary"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    family = FAMILIES[name]
    generation = manifest["generation"]
    assert generation["eos_token_ids"] == tokenizer.convert_tokens_to_ids(list(family.eos))
    assert generation["adds_bos"] == (family.bos is not None)
    assert generation["turn_end_token_id"] == tokenizer.convert_tokens_to_ids(family.eos[0])
    checks = {c["check"]: c["pass"] for c in manifest["parity"]["generation_checks"]}
    system = "template refuses: chat, a system message" if name == "gemma2" else "template: chat, a system message"
    assert checks[system] and all(checks.values())
    assert manifest["parity"]["generation"]["tokens_compared"] > 50


def test_gemma_serves_its_turns_and_refuses_a_system_role_as_openai_does(families_run: Path, tmp_path: Path):
    checkpoint = families_run / "gemma2" / "checkpoint-20"
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    chat = [{"role": "user", "content": "What comes after four?"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)
    expected = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
    with Server(tmp_path / "gemma.log", HANDOFF_MODEL_DIR=str(checkpoint.with_suffix(".export"))) as served:
        served.wait_ready()
        body = {"messages": chat, "max_tokens": 10, "temperature": 0}
        answer = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=60)
        system = [{"role": "system", "content": "You count."}, *chat]
        refused = httpx.post(f"{served.url}/v1/chat/completions", json=body | {"messages": system}, timeout=60)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == expected
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "System role not supported" in error["message"] and error["type"] == "BadRequestError"  # vLLM's


def test_a_family_the_builder_cannot_build_is_refused_in_one_line(families_run: Path, tmp_path: Path):
    out = tmp_path / "smollm3.export"
    done = run([sys.executable, "-m", "export", str(families_run / "smollm3/checkpoint-20"), "--out", str(out)])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1 and "no_rope_layers" in lines[0], done.stderr[-2000:]
    assert not out.exists()


def test_a_mistral_window_the_build_ignores_caps_the_served_context(families_run: Path):
    """onnxruntime-genai's Mistral attends to the whole context: with a sliding window shorter than the context, the
    served context is the window, where full attention and the window are one."""
    from export.generation_config import read_generation_config
    from export.tasks.text_generation import generation_settings

    checkpoint = families_run / "mistral" / "checkpoint-20"
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    for window, context in ((None, 256), (8, 8), (1024, 256)):
        config.sliding_window = window
        model = transformers.AutoModelForCausalLM.from_config(config)
        read = read_generation_config(checkpoint, model)
        assert generation_settings(tokenizer, model, read, checkpoint).context_length == context
