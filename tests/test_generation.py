"""A fine-tuned language model end to end: a tiny Llama chat model trained by Trainer under torchrun (2 gloo
processes), its checkpoint-N exported with no flags (and rank 0's DDP state_dict with --hf-config), served by
`bentoml serve` as OpenAI's API, its greedy answers equal to transformers' `generate` on prompts the export never
saw; streaming, stop strings, seeds, the context's limit, the cap on generations and a client that leaves."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
from conftest import Server, assert_serves_only_its_routes, attack_memory_mb, probe_timeout_s, run
from safetensors.torch import load_file
from test_serve_attacks import peak_growth_mb
from test_serve_attacks_round3 import slowest_probe_during

from contract.manifest import read_manifest_unchecked

pytestmark = pytest.mark.xdist_group("generation")

CHATS = [
    [{"role": "user", "content": "What comes after six?"}],
    [{"role": "system", "content": "You count."}, {"role": "user", "content": "What comes after two?"}],
    [
        {"role": "user", "content": "What comes after one?"},
        {"role": "assistant", "content": "After one comes two."},
        {"role": "user", "content": "What comes after seven?"},
    ],
]
PROMPTS = ["After five comes", "user\nWhat comes after eight?"]


@pytest.fixture(scope="module")
def reference(language_run: Path):
    checkpoint = language_run / "checkpoint-40"
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    return model, tokenizer


def greedy(reference, ids: list[int], max_new_tokens: int) -> tuple[str, int, str]:
    """transformers' greedy text, its token count and finish reason, as vLLM reports them."""
    model, tokenizer = reference
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, len(ids) :].tolist()
    eos = set(model.generation_config.eos_token_id)
    stopped = bool(new) and new[-1] in eos
    return tokenizer.decode(new, skip_special_tokens=True), len(new), "stop" if stopped else "length"


@pytest.fixture(scope="module")
def server(language_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("generation") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(language_run / "checkpoint-40.export"), HANDOFF_MAX_GENERATIONS="3") as srv:
        srv.wait_ready()
        yield srv


def test_the_trainer_checkpoint_exports_with_no_flags(language_run: Path, reference):
    manifest = read_manifest_unchecked(language_run / "checkpoint-40.export")
    assert manifest["task"] == "text-generation" and manifest["status"] == "passed", manifest["parity"]["summary"]
    generation = manifest["generation"]
    _, tokenizer = reference
    assert generation["eos_token_ids"] == [tokenizer.convert_tokens_to_ids("<|im_end|>"), 1]
    assert generation["bos_token_id"] == tokenizer.bos_token_id and generation["adds_bos"] is True
    assert generation["turn_end_token_id"] in generation["eos_token_ids"]
    assert generation["context_length"] == 4096
    compared = manifest["parity"]["generation"]
    assert compared["tokens_compared"] > 100 and compared["max_logit_diff"] < 1e-4
    assert all(check["pass"] for check in manifest["parity"]["generation_checks"])
    assert manifest["provenance"]["summary"].startswith("provenance: 21 of 21 model tensors equal the checkpoint's")


def test_the_consolidated_folder_is_the_checkpoint(language_run: Path):
    """hf/ holds the checkpoint's tensors as they are, and loads in transformers as the user's model."""
    export = language_run / "checkpoint-40.export"
    saved = load_file(export / "hf" / "model.safetensors")
    trained = load_file(language_run / "checkpoint-40" / "model.safetensors")
    assert saved.keys() == trained.keys()
    assert all(torch.equal(saved[k], trained[k]) for k in trained)
    assert transformers.AutoTokenizer.from_pretrained(export / "hf").chat_template is not None
    from_ddp = load_file(language_run / "ddp_state.export" / "hf" / "model.safetensors")
    assert all(torch.equal(from_ddp[k], trained[k]) for k in trained)  # rank 0's state_dict after the last step
    checks = read_manifest_unchecked(language_run / "ddp_state.export")["parity"]["generation_checks"]
    yours = [c for c in checks if "yours" in c["check"]]  # --prompts: a completion and a chat, each tokenized
    assert len(yours) == 2 + 2 * 2 and all(c["pass"] for c in yours)  # and generated to eos and past it


@pytest.mark.parametrize("layout", ["recipe", "torchtitan"])
def test_an_fsdp2_dcp_folder_exports_its_model_keys_only(language_fsdp2_run: Path, layout: str):
    """FSDP2 + DCP, the optimizer's state saved beside the model's under the same parameter names: only the
    model's tensors are read, and they are the full state the job ended with."""
    export = language_fsdp2_run / f"{layout}.export"
    manifest = read_manifest_unchecked(export)
    assert manifest["status"] == "passed" and manifest["source"]["container"] == "dcp"
    assert manifest["provenance"]["summary"].startswith("provenance: 21 of 21 model tensors equal the checkpoint's")
    expected = torch.load(language_fsdp2_run / "expected.pt")
    saved = load_file(export / "hf" / "model.safetensors")
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in expected)


def test_a_model_that_is_not_the_checkpoints_fails_parity(language_run: Path, reference):
    """The proof compares something: the exported GenAI model against an eager model one weight away from the
    checkpoint's (the lm_head's bias of one token raised) fails, on greedy ids or logits."""
    from export.generation_parity import CHATS as PARITY_CHATS
    from export.generation_parity import Prompt, compare_generation
    from export.parity import DEFAULT_TOLERANCES

    _, tokenizer = reference
    wrong = transformers.AutoModelForCausalLM.from_pretrained(language_run / "checkpoint-40").eval()
    with torch.no_grad():
        wrong.lm_head.weight[tokenizer.convert_tokens_to_ids("<|im_end|>")] *= 1.01
    ids = tokenizer.apply_chat_template(
        PARITY_CHATS[1][1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    genai = language_run / "checkpoint-40.export" / "genai"
    _, checks = compare_generation(
        wrong, wrong.generation_config, genai, [Prompt("a question", ids)], [4, 1], 2, 16, DEFAULT_TOLERANCES["fp32"]
    )
    assert checks and all(reason is not None for _, reason in checks), checks
    assert "logits differ" in checks[0][1]


def test_an_int4_model_is_served_only_past_its_gate(language_run: Path, tmp_path: Path):
    """--int4: the int4 model beside the proved fp32 one, held to the gate on the parity prompts and served in its
    place, saying so (/v1/models, /info), its answers the int4 model's own greedy ones; a gate it misses (an
    agreement it cannot reach) is exit 3 with by how much, and no int4 model written."""
    import onnxruntime_genai as og

    checkpoint, export = language_run / "checkpoint-40", tmp_path / "int4.export"
    done = run([sys.executable, "-m", "export", str(checkpoint), "--int4", "--out", str(export), "--no-bento"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    genai = read_manifest_unchecked(export)["genai"]
    gate = genai["gate"]
    assert genai["folder"] == "genai-int4" and genai["precision"] == "int4" and genai["proved"]["folder"] == "genai"
    assert gate["passed"] and gate["tokens"] > 0 and gate["near_ties"] == gate["first_differences"]
    assert gate["loglik_fp32"] - gate["loglik_int4"] <= gate["bounds"]["max_loglik_drop"]
    assert "MatMulNBits" in (export / "genai-int4" / "model.onnx").read_bytes().decode("latin-1")
    model = og.Model(str(export / "genai-int4"))
    messages = CHATS[0]
    with Server(tmp_path / "int4.log", HANDOFF_MODEL_DIR=str(export)) as served:
        served.wait_ready()
        assert httpx.get(f"{served.url}/v1/models", timeout=10).json()["data"][0]["precision"] == "int4"
        assert httpx.get(f"{served.url}/info", timeout=10).json()["model"]["genai"]["precision"] == "int4"
        body = {"messages": messages, "max_tokens": 12, "temperature": 0, "logprobs": False}
        answer = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=60).json()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 12, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    own = tokenizer.decode(generator.get_sequence(0)[len(ids) :].tolist(), skip_special_tokens=True)
    assert answer["choices"][0]["message"]["content"] == own and own, (answer, own)
    strict = tmp_path / "strict.export"
    command = [sys.executable, "-m", "export", str(checkpoint), "--int4", "--int4-min-agreement", "0.99"]
    missed = run([*command, "--out", str(strict), "--no-bento"])
    assert missed.returncode == 3 and "below the gate's 99% by" in missed.stdout + missed.stderr
    assert not (strict / "genai-int4").exists() and read_manifest_unchecked(strict)["genai"]["precision"] == "fp32"


def test_a_changed_model_file_is_never_served(language_run: Path, tmp_path: Path):
    export = tmp_path / "export"
    shutil.copytree(language_run / "checkpoint-40.export", export)
    data = export / "genai" / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(export)) as server:
        server.wait_live()
        for _ in range(100):
            info = httpx.get(server.url + "/info").json()
            if "reason" in info:
                break
            time.sleep(0.1)
        assert server.status("/readyz") == 503
        assert "genai/model.onnx.data: sha256" in info["reason"] and "does not match the manifest" in info["reason"]


def test_a_lora_adapter_is_merged_into_its_base(language_run: Path, tmp_path: Path):
    """A PEFT LoRA adapter of the language model (its folder naming the base) exports with no flags: the consolidated
    weights are PEFT's merge_and_unload's, and parity passes on the merged model."""
    import peft

    base = tmp_path / "base"
    shutil.copytree(language_run / "checkpoint-40", base, ignore=shutil.ignore_patterns("optimizer.pt", "rng_*"))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    lora = peft.LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    adapted = peft.get_peft_model(model, lora)
    with torch.no_grad():
        for name, weight in adapted.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.05)  # as after training: an adapter that changes the model
    adapted.peft_config["default"].base_model_name_or_path = str(base)
    adapted.save_pretrained(tmp_path / "adapter")
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(tmp_path / "adapter")
    done = run(
        [sys.executable, "-m", "export", str(tmp_path / "adapter"), "--no-bento", "--out", str(tmp_path / "out")]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest_unchecked(tmp_path / "out")
    assert manifest["status"] == "passed" and manifest["provenance"]["adapter"]
    merged = adapted.merge_and_unload().state_dict()
    saved = load_file(tmp_path / "out" / "hf" / "model.safetensors")
    assert all(torch.allclose(saved[k], merged[k], atol=1e-6) for k in saved)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(saved[q], load_file(base / "model.safetensors")[q])  # the adapter is in it


def test_chat_completions_equal_transformers_greedy(server, reference):
    _, tokenizer = reference
    for chat in CHATS:
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
        text, count, reason = greedy(reference, ids, 40)
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": chat, "temperature": 0, "max_tokens": 40})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["object"] == "chat.completion"
        assert answer["choices"][0]["message"] == {"role": "assistant", "content": text}
        assert answer["choices"][0]["finish_reason"] == reason
        assert answer["usage"] == {
            "prompt_tokens": len(ids),
            "completion_tokens": count,
            "total_tokens": len(ids) + count,
        }


def test_completions_and_their_stream_equal_transformers_greedy(server, reference):
    _, tokenizer = reference
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        text, count, reason = greedy(reference, ids, 30)
        body = {"prompt": prompt, "temperature": 0, "max_tokens": 30}
        whole = httpx.post(server.url + "/v1/completions", json=body).json()
        assert whole["choices"][0]["text"] == text and whole["choices"][0]["finish_reason"] == reason
        events = stream(server.url + "/v1/completions", body | {"stream_options": {"include_usage": True}})
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == text
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == reason
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == count


def test_a_chat_stream_carries_the_role_first_and_the_reason_last(server, reference):
    events = stream(server.url + "/v1/chat/completions", {"messages": CHATS[0], "temperature": 0, "max_tokens": 40})
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons[-1] in ("stop", "length") and set(reasons[:-1]) == {None}


def stream(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url, json=body | {"stream": True}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def test_stop_strings_end_the_text_before_them_and_seeds_repeat(server, reference):
    _, tokenizer = reference
    ids = tokenizer.apply_chat_template(CHATS[0], add_generation_prompt=True, tokenize=True, return_dict=False)
    text, _, _ = greedy(reference, ids, 40)
    stop = text.split()[1]  # a word in the middle of the greedy answer
    body = {"messages": CHATS[0], "temperature": 0, "max_tokens": 40, "stop": [stop]}
    answer = httpx.post(server.url + "/v1/chat/completions", json=body).json()["choices"][0]
    assert answer["message"]["content"] == text[: text.index(stop)] and answer["finish_reason"] == "stop"
    sampled = {"prompt": "After", "temperature": 1.5, "max_tokens": 30, "min_tokens": 30, "seed": 7}
    first, again = (httpx.post(server.url + "/v1/completions", json=sampled).json() for _ in range(2))
    assert first["choices"][0]["text"] == again["choices"][0]["text"]
    other = httpx.post(server.url + "/v1/completions", json=sampled | {"seed": 8}).json()
    assert other["choices"][0]["text"] != first["choices"][0]["text"]


def test_a_top_k_past_the_vocabulary_takes_every_token_streamed_or_not(server):
    """Security round 5, item 4: a top_k past the vocabulary was a 500 (and a stream cut with no [DONE])."""
    body = {"prompt": "After", "temperature": 1.0, "top_k": 1_000_000, "seed": 3, "max_tokens": 4}
    whole = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert whole.status_code == 200, whole.text
    assert stream(server.url + "/v1/completions", body | {"stream": True})[-1] == "[DONE]"


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"prompt": "After " * 5000, "max_tokens": 5}, 400, "maximum context length is 4096 tokens"),
        ({"prompt": "x" * 100_001}, 413, "past HANDOFF_MAX_TEXT_CHARS"),
        ({"prompt": "After", "max_tokens": 5000}, 400, "you requested 5002 tokens (2 in the prompt"),
        ({"prompt": "After", "n": 4}, 400, "n=4: at most 3 choices (HANDOFF_MAX_GENERATIONS)"),
        ({"prompt": "After", "logit_bias": {"1": 5}}, 400, "logit_bias: not supported"),
        ({"prompt": "After", "model": "gpt-4"}, 404, "The model `gpt-4` does not exist"),
        ({"prompt": [1, 99999]}, 400, "token ids must be between 0 and"),
        ({"prompt": "After", "seed": 2**32}, 400, "seed=4294967296: must be a whole number between 0 and 2147483647"),
        ({"messages": []}, 400, "prompt"),
    ],
)
def test_wrong_requests_get_openai_error_bodies(server, body, status, says):
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == status and says in r.json()["error"]["message"], r.text
    assert r.json()["error"]["code"] == status


def test_the_front_doors_refusals_are_openai_error_bodies_too(server):
    """Refused before the task sees it (a body that is not JSON, one past its size): still OpenAI's body."""
    r = httpx.post(server.url + "/v1/completions", content=b"After", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == 415 and r.json()["error"]["message"]
    r = httpx.post(
        server.url + "/v1/completions", content=b"{" * 30_000_000, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"]["type"] == "BadRequestError"


def test_a_language_model_documents_and_answers_its_own_routes_alone(server):
    assert_serves_only_its_routes(server.url, {"POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models"})
    infer = httpx.post(f"{server.url}/v2/models/handoff/infer", json={"inputs": []})
    assert infer.status_code == 400 and "/v1/completions" in infer.json()["error"], infer.text


def test_a_chat_the_template_refuses_is_a_400(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "robot", "content": "hi"}]})
    assert r.status_code == 400 and "messages[0]" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"] == 4096


ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "number": {"type": "integer", "minimum": 0, "maximum": 9},
        "word": {"enum": ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]},
        "sure": {"type": "boolean"},
    },
    "required": ["number", "word", "sure"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_response_parses_and_validates(server, stream: bool):
    """response_format constrains decoding (ONNX Runtime GenAI's guidance): every answer parses and validates against
    the schema, streamed or not, sampled or greedy; JSON mode gives an object."""
    import jsonschema

    schema_format = {"type": "json_schema", "json_schema": {"name": "count", "schema": ANSWER_SCHEMA, "strict": True}}
    for temperature, seed in ((0, None), (1.0, 3), (1.0, 4)):
        for messages in CHATS:
            body = {"messages": messages, "max_tokens": 60, "temperature": temperature, "seed": seed}
            text = chat_text(server, body | {"response_format": schema_format}, stream)
            jsonschema.validate(json.loads(text), ANSWER_SCHEMA)
    text = chat_text(
        server, {"messages": CHATS[0], "max_tokens": 60, "response_format": {"type": "json_object"}}, stream
    )
    assert text.startswith("{")  # an object, as far as max_tokens let it go
    with contextlib.suppress(json.JSONDecodeError):
        assert isinstance(json.loads(text), dict)


def chat_text(server, body: dict, stream: bool) -> str:
    """The assistant's text of a chat completion, read whole or from its stream."""
    if not stream:
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["message"]["content"]
    pieces = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body | {"stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                pieces.append(delta.get("content") or "")
    return "".join(pieces)


@pytest.mark.parametrize(
    ("response_format", "says"),
    [
        ({"type": "xml"}, "response_format: one of"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}, "must be {"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "object", "pad": "x" * 40_000}}}, "at most 32768"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "frobnicate"}}}, "the schema cannot be followed"),
    ],
)
def test_a_response_format_that_cannot_be_followed_is_a_400(server, response_format: dict, says: str):
    body = {"messages": CHATS[0], "max_tokens": 8, "response_format": response_format}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400 and says in answer.json()["error"]["message"], answer.text


def transformers_logprobs(reference, ids: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens after `ids` and each step's log-softmax of its raw logits."""
    model, _ = reference
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(ids) :].tolist(), torch.log_softmax(torch.stack(out.logits)[:, 0].double(), -1)


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_are_transformers_log_softmax(server, reference, stream: bool):
    """A chat's `logprobs` with `top_logprobs`, and a completion's `logprobs`: each token's log-probability and the
    likeliest tokens' equal transformers' log-softmax of the step's logits (within 1e-4), as OpenAI shapes them."""
    _, tokenizer = reference
    messages = CHATS[0]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    tokens, steps = transformers_logprobs(reference, ids, 8)
    eos = set(reference[0].generation_config.eos_token_id)
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    if stream:
        content = []
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body | {"stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    content += (choice["logprobs"] or {}).get("content", [])
    else:
        content = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
        content = content["logprobs"]["content"]
    kept = [t for t in tokens if t not in eos]  # an eos has no text, and no entry
    assert len(content) == len(kept) > 0
    for step, (token, entry) in enumerate(zip(kept, content, strict=True)):
        assert entry["token"] == tokenizer.decode([token]) and entry["bytes"] == list(entry["token"].encode())
        assert abs(entry["logprob"] - float(steps[step, token])) < 1e-4
        best = torch.topk(steps[step], 3)
        assert [a["token"] for a in entry["top_logprobs"]] == [tokenizer.decode([int(i)]) for i in best.indices]
        np.testing.assert_allclose([a["logprob"] for a in entry["top_logprobs"]], best.values.numpy(), atol=1e-4)
    prompt = PROMPTS[0]
    tokens, steps = transformers_logprobs(reference, tokenizer(prompt)["input_ids"], 6)
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2}
    legacy = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    kept = [t for t in tokens if t not in eos]
    np.testing.assert_allclose(legacy["token_logprobs"], [float(steps[i, t]) for i, t in enumerate(kept)], atol=1e-4)
    assert legacy["tokens"] == [tokenizer.decode([t]) for t in kept] and len(legacy["top_logprobs"][0]) == 2
    assert legacy["text_offset"] == list(np.cumsum([0, *map(len, legacy["tokens"][:-1])]))


@pytest.mark.parametrize(
    ("path", "fields", "says"),
    [
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "between 0 and 20"),
        ("/v1/chat/completions", {"logprobs": 3}, "logprobs: true or false"),
        ("/v1/completions", {"logprobs": True}, "logprobs=True: must be a whole number"),
        ("/v1/completions", {"top_logprobs": 2}, "top_logprobs: a chat's"),
    ],
)
def test_logprobs_it_cannot_give_are_a_400(server, path: str, fields: dict, says: str):
    body = {"messages": CHATS[0]} if "chat" in path else {"prompt": PROMPTS[0]}
    answer = httpx.post(f"{server.url}{path}", json=body | {"max_tokens": 4} | fields, timeout=30)
    assert answer.status_code == 400 and says in answer.json()["error"]["message"], answer.text


def test_n_choices_are_generations_of_the_one_prompt(server, reference):
    """n > 1: each choice a generation of its own (a seed gives choice i the seed + i, so a choice is the answer
    of that seed alone), greedy ones transformers' each, streamed chunks carrying their choice's index, the usage
    counting every choice's tokens."""
    url = f"{server.url}/v1/chat/completions"
    messages = CHATS[2]
    sampled = {"messages": messages, "max_tokens": 12, "temperature": 1.0, "seed": 11}
    answer = httpx.post(url, json=sampled | {"n": 3}, timeout=60).json()
    texts = [c["message"]["content"] for c in sorted(answer["choices"], key=lambda c: c["index"])]
    alone = [httpx.post(url, json=sampled | {"seed": 11 + i}, timeout=60).json() for i in range(3)]
    assert texts == [a["choices"][0]["message"]["content"] for a in alone]
    assert answer["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone)
    _, tokenizer = reference
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = greedy(reference, ids, 12)[0]
    greedy_body = {"messages": messages, "max_tokens": 12, "temperature": 0, "n": 2, "stream": True}
    pieces: dict[int, list[str]] = {0: [], 1: []}
    with httpx.stream("POST", url, json=greedy_body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                pieces[choice["index"]].append(choice["delta"].get("content") or "")
    assert ["".join(pieces[0]), "".join(pieces[1])] == [expected, expected]


def test_generations_at_once_each_answer_as_alone(server, reference):
    """HANDOFF_MAX_GENERATIONS=3: three chats at once on the one model, each answered as transformers answers it."""
    _, tokenizer = reference
    prompts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in CHATS
    ]
    expected = [greedy(reference, ids, 40)[0] for ids in prompts]

    async def together() -> list[str]:
        async with httpx.AsyncClient(timeout=60) as client:
            bodies = [{"messages": chat, "temperature": 0, "max_tokens": 40} for chat in CHATS]
            answers = await asyncio.gather(*(client.post(server.url + "/v1/chat/completions", json=b) for b in bodies))
        return [a.json()["choices"][0]["message"]["content"] for a in answers]

    assert asyncio.run(together()) == expected


def test_past_the_cap_is_a_429_and_clients_that_leave_stop_their_generations(server):
    """HANDOFF_MAX_GENERATIONS=3: while three long generations stream, another request is a 429 with Retry-After;
    the clients leaving stop their generations (the log says after how many of their 4000 tokens)."""
    before = server.log.read_text().count("the client left after")

    async def scenario() -> None:
        long = {"prompt": "After", "max_tokens": 4000, "min_tokens": 4000, "stream": True}
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
            readers = []  # kept: a line iterator dropped closes its response, and so its connection
            for _ in range(3):
                stream = await stack.enter_async_context(
                    client.stream("POST", server.url + "/v1/completions", json=long)
                )
                readers.append(stream.aiter_lines())
                while not (await anext(readers[-1])).startswith("data: "):
                    pass
            more = await client.post(server.url + "/v1/completions", json={"prompt": "After", "max_tokens": 2})
            assert more.status_code == 429 and more.headers["retry-after"] == "1"
            assert "HANDOFF_MAX_GENERATIONS" in more.json()["error"]["message"]
        # the three connections are closed here, mid-generation
        for _ in range(100):
            await asyncio.sleep(0.1)
            if server.log.read_text().count("the client left after") >= before + 3:
                break
        said = [line for line in server.log.read_text().splitlines() if "the client left after" in line][before:]
        assert len(said) == 3 and all(int(line.split("after ")[1].split()[0]) < 4000 for line in said)
        async with httpx.AsyncClient(timeout=30) as client:  # the slots are free again
            again = await client.post(server.url + "/v1/completions", json={"prompt": "After", "max_tokens": 2})
            assert again.status_code == 200

    asyncio.run(scenario())


def test_a_chat_of_empty_messages_or_a_prompt_of_millions_of_ids_never_stalls_the_worker(server):
    """Security round 5, items 1 and 2, as the probe sent them: 600,000 empty messages (17 MB) and a prompt of 9
    million token ids are refused at the door (413: more than any chat or prompt the context takes), and chats or
    prompts under that body limit but past the context are refused before they are rendered or walked (400); /livez
    answers in its normal time throughout, and every refusal is OpenAI's error body."""
    chat = json.dumps({"messages": [{"role": "user", "content": ""}] * 600_000}).encode()
    ids = b'{"prompt": [' + b",".join([b"7"] * 9_000_000) + b"]}"
    many = json.dumps({"messages": [{"role": "user", "content": ""}] * 5_000}).encode()
    long_ids = json.dumps({"prompt": [7] * 5_000}).encode()
    headers = {"content-type": "application/json"}

    def attack() -> list[httpx.Response]:
        return [
            httpx.post(f"{server.url}{route}", content=body, headers=headers, timeout=60)
            for route, body in (
                ("/v1/chat/completions", chat),
                ("/v1/completions", ids),
                ("/v1/chat/completions", many),
                ("/v1/completions", long_ids),
            )
        ]

    growth, (slowest, answers) = peak_growth_mb(server.proc.pid, lambda: slowest_probe_during(server, attack))
    print(f"\nempty messages and millions of ids: /livez slowest {slowest * 1000:.0f} ms, peak +{growth:.0f} MB")
    assert growth < attack_memory_mb(), f"the service grew {growth:.0f} MB"  # before: 123 MB -> 1.29 GB, kept
    assert slowest < probe_timeout_s(), slowest  # before: 33.6 s and 1.6-2.6 s
    assert [a.status_code for a in answers] == [413, 413, 400, 400], [a.text[:200] for a in answers]
    assert all(a.json()["error"]["code"] == a.status_code for a in answers)
    assert "5000 messages" in answers[2].json()["error"]["message"]
    assert "your prompt is 5000 tokens" in answers[3].json()["error"]["message"]
    assert server.status("/readyz") == 200


def _edited(language_run: Path, tmp_path: Path, edit) -> Path:
    """A copy of the Trainer checkpoint with `edit(folder)` applied."""
    folder = tmp_path / "checkpoint-40"
    shutil.copytree(language_run / "checkpoint-40", folder, ignore=shutil.ignore_patterns("optimizer.pt", "rng_*"))
    edit(folder)
    return folder


def _config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))


def _generation(folder: Path, **changes) -> None:
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(config | changes))


def _without_eos(folder: Path) -> None:
    (folder / "generation_config.json").unlink()
    _config(folder, eos_token_id=None)
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer | {"eos_token": None}))


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (
            lambda f: _config(f, architectures=["BloomForCausalLM"]),
            "BloomForCausalLM is a language model that ONNX Runtime",
        ),
        (lambda f: _config(f, auto_map={"AutoModelForCausalLM": "x.Y"}), "--trust-remote-code"),
        (lambda f: _config(f, quantization_config={"quant_method": "gptq"}), "a quantized checkpoint (gptq)"),
        (lambda f: (f / "tokenizer.json").unlink() or (f / "tokenizer_config.json").unlink(), "no tokenizer beside"),
        (
            lambda f: (f / "generation_config.json").write_text(json.dumps({"eos_token_id": [1]})),
            "ends an assistant's turn with '<|im_end|>' (id 4), which is not one of the eos ids [1]",
        ),
        (_without_eos, "no eos token id (generation_config.json, config.json or the tokenizer)"),
        (lambda f: _generation(f, no_repeat_ngram_size=3), "no_repeat_ngram_size=3: generate() applies it"),
        (lambda f: _generation(f, bad_words_ids=[[7]], num_beams=2), "num_beams=2, bad_words_ids=[[7]]"),
    ],
    ids=["architecture", "remote-code", "quantized", "no-tokenizer", "turn-end-not-eos", "no-eos", "ngram", "beams"],
)
def test_what_cannot_be_served_is_refused_in_one_line(language_run: Path, tmp_path: Path, edit, says):
    folder = _edited(language_run, tmp_path, edit)
    done = run([sys.executable, "-m", "export", str(folder), "--no-bento", "--out", str(tmp_path / "out")])
    assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_an_engine_that_dies_makes_the_service_unready_not_hung(server):
    """The last test of the module: the generation engine's process killed, requests are 503 at once and the
    readiness probes say why."""
    import psutil

    (engine,) = [
        p for p in psutil.Process(server.proc.pid).children(recursive=True) if "spawn_main" in " ".join(p.cmdline())
    ]
    engine.kill()
    for _ in range(50):
        if server.status("/readyz") == 503:
            break
        time.sleep(0.1)
    assert server.status("/readyz") == 503
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "After", "max_tokens": 2})
    assert r.status_code == 503 and "engine's process ended" in r.text


def test_the_folders_generation_config_is_served_and_proved(language_run: Path, reference, tmp_path: Path):
    """A repetition penalty (as Qwen2.5-Instruct's generation_config.json carries one) in parity and in every answer,
    unless a request gives its own; the folder's sampling settings are what a request that leaves them out gets."""
    folder = _edited(
        language_run, tmp_path, lambda f: _generation(f, repetition_penalty=1.3, top_k=20, temperature=0.6)
    )
    done = run([sys.executable, "-m", "export", str(folder), "--no-bento", "--formats", "onnx"])
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest_unchecked(tmp_path / "checkpoint-40.export")
    assert manifest["status"] == "passed" and manifest["generation"]["repetition_penalty"] == 1.3
    assert manifest["generation"]["request_defaults"] == {"temperature": 0.6, "top_k": 20.0}
    assert manifest["generation_config"]["settings"]["repetition_penalty"] == "honoured: served and in parity"
    model, tokenizer = reference
    config = transformers.GenerationConfig.from_pretrained(folder)
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(tmp_path / "checkpoint-40.export")) as srv:
        srv.wait_ready()
        differs = 0
        for chat in [*CHATS, [{"role": "user", "content": "Count with me."}]]:
            ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
            config.update(max_new_tokens=30, do_sample=False)
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), generation_config=config)
            want = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
            body = {"messages": chat, "temperature": 0, "max_tokens": 30}
            got = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()
            assert got["choices"][0]["message"]["content"] == want, (chat, got)
            plain = httpx.post(srv.url + "/v1/chat/completions", json=body | {"repetition_penalty": 1}, timeout=60)
            assert plain.json()["choices"][0]["message"]["content"] == greedy(reference, ids, 30)[0]
            differs += want != greedy(reference, ids, 30)[0]
        assert differs, "the penalty changes no answer: the test would not see it dropped"
