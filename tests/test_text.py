"""Hugging Face text classifiers end to end: Trainer's checkpoint-N (trained under torchrun with 2 gloo processes)
exported with no flags, served, and answering /classify and the protocol's BYTES texts as the eager model does on
the same tokenizer's ids. The DDP state_dict + --hf-config case, and the refusals."""

from __future__ import annotations

import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
import tritonclient.http as triton
from conftest import Server, run
from safetensors.numpy import load_file

from contract.manifest import read_manifest_unchecked

pytestmark = pytest.mark.xdist_group("text")

TEXTS = [
    "the film was superb.",
    "the meal was awful.",
    "this book was a joy to watch and I would say so to anyone who asked me about it.",
    "our trip was dull",
    "Great!",
]
ATOL = 1e-4
LABELS = ("negative", "positive")


@pytest.fixture(scope="module")
def eager(text_run: Path):
    """The trained model and its tokenizer as transformers loads them: the reference every answer is held to."""
    checkpoint = text_run / "checkpoint-30"
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint, local_files_only=True).eval()

    def logits(text: str) -> np.ndarray:
        with torch.no_grad():
            ids = tokenizer(text, truncation=True, max_length=32, return_tensors="pt")
            return model(**ids).logits[0].numpy()

    return logits


@pytest.fixture(scope="module")
def server(text_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("text") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(text_run / "checkpoint-30.export"), HANDOFF_MAX_TEXT_CHARS="2000") as srv:
        srv.wait_ready()
        yield srv


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_trainers_checkpoint_exports_with_no_flags_and_its_tokenizer(text_run: Path):
    manifest = read_manifest_unchecked(text_run / "checkpoint-30.export")
    assert manifest["task"] == "text-classification" and manifest["status"] == "passed"
    assert manifest["arch"] == "DistilBertForSequenceClassification" and manifest["labels"] == ["negative", "positive"]
    assert manifest["source"]["container"] == "transformers"
    tokenizer = manifest["tokenizer"]
    assert tokenizer["max_length"] == 32 and tokenizer["pad_token"] == "[PAD]" and tokenizer["padding_side"] == "right"
    assert tokenizer["inputs"] == ["input_ids", "attention_mask"]
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", "model.onnx"} <= set(manifest["artifacts"])
    assert [c["check"] for c in manifest["parity"]["text"]] == ["tokenizer", "padding (CPUExecutionProvider)"] + [
        "transformers pipeline"  # the library is the reference: the pipeline's logits and scores, texts and pairs
    ]
    assert manifest["reference"]["library"] == "transformers" and manifest["reference"]["call"].startswith("pipeline(")
    assert all(c["pass"] for c in manifest["parity"]["text"]) and manifest["parity"]["pass"]
    shapes = {t["name"]: t["shape"] for t in manifest["signature"]["inputs"]}
    assert shapes == {"input_ids": [-1, -1], "attention_mask": [-1, -1]}


def test_classify_answers_a_text_as_the_eager_model(server, eager):
    for text in TEXTS:
        for answer in (
            httpx.post(f"{server.url}/classify", json={"text": text, "top_k": 2}, timeout=30),
            httpx.post(f"{server.url}/classify", content=text.encode(), headers={"content-type": "text/plain"}),
        ):
            assert answer.status_code == 200, answer.text
            expected = softmax(eager(text))
            best = answer.json()["predictions"]
            assert best[0]["index"] == int(expected.argmax()) and best[0]["label"] in ("negative", "positive")
            assert abs(best[0]["probability"] - expected.max()) < ATOL
    one = httpx.post(f"{server.url}/classify?top_k=1", content=b"dull", headers={"content-type": "text/plain"}).json()
    assert len(one["predictions"]) == 1 and one["truncated"] is False


def test_a_text_past_the_models_length_is_truncated_and_says_so(server, eager):
    text = " ".join(TEXTS * 4)
    answer = httpx.post(f"{server.url}/classify", json={"text": text}, timeout=30).json()
    assert answer["truncated"] is True
    assert abs(answer["predictions"][0]["probability"] - softmax(eager(text)).max()) < ATOL


def test_24_texts_of_different_lengths_at_once_each_as_alone(server, eager):
    texts = [" ".join([TEXTS[i % len(TEXTS)]] * (1 + i % 3)) for i in range(24)]

    def send(text: str) -> dict:
        answer = httpx.post(f"{server.url}/classify", json={"text": text, "top_k": 2}, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()

    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(send, texts))
    for text, answer in zip(texts, answers, strict=True):
        expected = softmax(eager(text))
        got = {p["index"]: p["probability"] for p in answer["predictions"]}
        assert max(abs(got[i] - expected[i]) for i in range(2)) < ATOL, text


def test_the_protocol_takes_texts_as_bytes(server, eager):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    metadata = client.get_model_metadata("handoff")
    assert [i["name"] for i in metadata["inputs"]] == ["text", "text_pair"]  # a pair beside a text, where it is one
    texts = np.array([t.encode() for t in TEXTS], dtype=object)
    given = triton.InferInput("text", [len(TEXTS)], "BYTES")
    given.set_data_from_numpy(texts)
    wanted = [triton.InferRequestedOutput("logits"), triton.InferRequestedOutput("probabilities", class_count=1)]
    result = client.infer("handoff", [given], outputs=wanted)
    expected = np.stack([eager(t) for t in TEXTS])
    assert np.abs(result.as_numpy("logits") - expected).max() < ATOL
    labels = [row[0].decode().split(":")[2] for row in result.as_numpy("probabilities")]
    assert labels == [["negative", "positive"][i] for i in expected.argmax(1)]


def test_bad_texts_get_a_4xx_naming_the_problem(server):
    url = f"{server.url}/classify"
    cases = [
        ({"json": {"text": ""}}, 400, "empty"),
        ({"json": {"text": 7}}, 400, "must be a string"),
        ({"json": {"words": "hi"}}, 400, "expected a JSON object"),
        ({"json": {"text": "hi", "top_k": 0}}, 400, "top_k"),
        ({"json": {"text": "hi", "top_k": "\u00b2"}}, 400, "top_k"),  # '²' passed isdigit(), then int(): a 500
        ({"json": {"text": "hi", "top_k": "\u2460"}}, 400, "top_k"),  # '①', the same (security round 4, item 9)
        ({"content": b"\xff\xfe", "headers": {"content-type": "text/plain"}}, 400, "UTF-8"),
        ({"json": {"text": "x" * 2001}}, 413, "HANDOFF_MAX_TEXT_CHARS"),
        ({"content": b"\x89PNG\r\n", "headers": {"content-type": "image/png"}}, 415, "classifies text"),
        ({"json": {"text": "hi", "text_pair": ""}}, 400, "empty"),
    ]
    for kwargs, status, words in cases:
        answer = httpx.post(url, timeout=30, **kwargs)
        assert answer.status_code == status and words in answer.json()["error"], (kwargs, answer.text)
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    bad = triton.InferInput("text", [1], "BYTES")
    bad.set_data_from_numpy(np.array([b"\xff"], dtype=object))
    with pytest.raises(Exception, match="UTF-8"):
        client.infer("handoff", [bad])
    assert server.status("/readyz") == 200


def test_a_pair_is_taken_without_a_flag_as_the_pipeline_takes_it(server, text_run: Path):
    """Exported with no flags, the classifier takes a pair of texts as transformers' text-classification pipeline
    does for any sequence classifier (`{"text", "text_pair"}`), a long pair truncated longest-first; on the
    protocol, `text_pair` beside `text`."""
    checkpoint = text_run / "checkpoint-30"
    classify = transformers.pipeline("text-classification", model=str(checkpoint), device="cpu", top_k=None)
    assert read_manifest_unchecked(text_run / "checkpoint-30.export")["tokenizer"]["takes_pairs"] is True
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[2] + " " + TEXTS[2]), ("Great!", TEXTS[3])]
    for text, pair in pairs:
        expected = {p["label"]: p["score"] for p in classify({"text": text, "text_pair": pair}, truncation=True)}
        answer = httpx.post(f"{server.url}/classify", json={"text": text, "text_pair": pair}, timeout=30)
        assert answer.status_code == 200, answer.text
        got = {p["label"]: p["probability"] for p in answer.json()["predictions"]}
        assert got == pytest.approx(expected, abs=ATOL), (text, pair)
    assert (
        answer.json()["truncated"] is False
        and httpx.post(f"{server.url}/classify", json={"text": TEXTS[2], "text_pair": TEXTS[2] * 2}).json()["truncated"]
    )
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    columns = []
    for name, texts in (("text", [a for a, _ in pairs]), ("text_pair", [b for _, b in pairs])):
        column = triton.InferInput(name, [len(texts)], "BYTES")
        column.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
        columns.append(column)
    logits = client.infer("handoff", columns).as_numpy("logits")
    for row, (text, pair) in zip(logits, pairs):
        raw = classify({"text": text, "text_pair": pair}, truncation=True, function_to_apply="none")
        assert [row[0], row[1]] == pytest.approx([{p["label"]: p["score"] for p in raw}[n] for n in LABELS], abs=ATOL)
    single = client.infer("handoff", columns[:1]).as_numpy("logits")
    assert np.abs(logits - single).max() > 100 * ATOL  # a pair is not its first text alone


def test_predict_still_takes_token_ids(server, eager):
    tokenizer_ids = {"input_ids": [[2, 10, 11, 3]], "attention_mask": [[1, 1, 1, 1]]}
    answer = httpx.post(f"{server.url}/predict", json={"inputs": tokenizer_ids}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert set(answer.json()["outputs"]) == {"logits", "probabilities"}


def export_state_dict(text_run: Path, config: Path, *more: str):
    """`python -m export ddp_state.pt --hf-config CONFIG ...`: rank 0's DDP state_dict, with a config folder."""
    return run([sys.executable, "-m", "export", str(text_run / "ddp_state.pt"), "--hf-config", str(config), *more])


def test_a_ddp_state_dict_exports_with_hf_config(text_run: Path, tmp_path: Path):
    """rank 0's `torch.save(ddp_model.state_dict())` (`module.` keys), beside no config: --hf-config names the
    folder the model was built from; the weights are the checkpoint's, the tokenizer found there."""
    out = tmp_path / "from_state"
    done = export_state_dict(
        text_run, text_run / "base", "--out", str(out), "--no-bento", "--formats", "onnx,safetensors"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest_unchecked(out)
    assert manifest["source"]["removed_prefixes"] == ["module."] and manifest["status"] == "passed"
    ours, theirs = (
        load_file(out / "model.safetensors"),
        load_file(text_run / "checkpoint-30.export" / "model.safetensors"),
    )
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_remote_code_is_refused_in_one_line(text_run: Path, tmp_path: Path):
    remote = tmp_path / "remote"
    shutil.copytree(text_run / "base", remote)
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "mine.Config"}}))
    refused = export_state_dict(text_run, remote)
    assert refused.returncode == 2 and "--trust-remote-code" in refused.stderr
    assert not (text_run / "ddp_state.export").exists(), "nothing is written for a refused export"


def test_a_model_without_a_tokenizer_exports_as_a_model_of_token_ids(text_run: Path, tmp_path: Path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(text_run / "base" / "config.json", bare)
    out = tmp_path / "ids.export"
    done = export_state_dict(text_run, bare, "--out", str(out), "--no-bento", "--formats", "onnx")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no tokenizer" in done.stderr and "--tokenizer" in done.stderr
    manifest = read_manifest_unchecked(out)
    assert manifest["task"] == "tensors" and manifest["status"] == "passed" and "tokenizer" not in manifest
    assert [t["name"] for t in manifest["signature"]["inputs"]] == ["input_ids", "attention_mask"]


def test_every_tensor_of_the_trainers_export_is_the_checkpoints(text_run: Path):
    manifest = read_manifest_unchecked(text_run / "checkpoint-30.export")
    proof = manifest["provenance"]
    assert proof["pass"] and proof["matched"] == proof["model_tensors"] == proof["checkpoint_tensors"]
    assert not proof["tied"] and not proof["not_loaded_count"] and not proof["unused_count"]
    # parity ran on the shortest text, the longest (cut at the model's 32 tokens), a batch of mixed lengths, and as
    # many pairs (it takes a pair too), long ones truncated longest-first
    assert "input_ids int64 [18, 32]" in manifest["parity"]["inputs_described"]
    assert "length 32 cut to 2" in manifest["parity"]["inputs_described"]


def test_weights_of_another_architecture_are_refused_not_exported_at_random(text_run: Path, tmp_path: Path):
    """A DistilBERT state_dict with a BERT config: not one encoder tensor fits. Refused, naming what is missing."""
    bert = tmp_path / "bert"
    transformers.BertConfig(
        vocab_size=300,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
        architectures=["BertForSequenceClassification"],
    ).save_pretrained(bert)
    out = tmp_path / "never"
    refused = export_state_dict(text_run, bert, "--out", str(out), "--no-bento")
    lines = [line for line in refused.stderr.splitlines() if line.startswith("export:")]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-2000:]
    assert "missing: bert.embeddings" in lines[0] and "(39 in all)" in lines[0]
    assert "unexpected: module.distilbert." in lines[0]
    assert not out.exists()


def test_a_model_deep_in_the_users_wrapper_under_ddp_keeps_its_own_weights(text_run: Path, tmp_path: Path):
    """`module.net.backbone.*`: the user's model holds the classifier two attributes deep, wrapped for data
    parallelism (DataParallel names its keys as DDP does). Exported with the trained weights, not initial ones."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(text_run / "checkpoint-30")
    net = torch.nn.Module()
    net.backbone = model
    wrapper = torch.nn.Module()
    wrapper.net = net
    torch.save(torch.nn.DataParallel(wrapper).state_dict(), tmp_path / "wrapped.pt")
    out = tmp_path / "wrapped.export"
    done = run(
        [sys.executable, "-m", "export", str(tmp_path / "wrapped.pt"), "--hf-config", str(text_run / "base")]
        + ["--out", str(out), "--no-bento", "--formats", "onnx,safetensors"]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest_unchecked(out)
    assert manifest["source"]["removed_prefixes"] == ["module.", "net.backbone. (attribute prefix)"]
    assert manifest["provenance"]["matched"] == manifest["provenance"]["model_tensors"]
    ours = load_file(out / "model.safetensors")
    theirs = load_file(text_run / "checkpoint-30.export" / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_a_reinitialised_head_is_refused_unless_allowed_and_then_recorded(text_run: Path, tmp_path: Path):
    state = torch.load(text_run / "ddp_state.pt", map_location="cpu", weights_only=True)
    headless = tmp_path / "headless.pt"
    torch.save({k: v for k, v in state.items() if ".classifier." not in k}, headless)
    base = ["--hf-config", str(text_run / "base"), "--no-bento", "--formats", "onnx"]
    refused = run([sys.executable, "-m", "export", str(headless), *base, "--out", str(tmp_path / "never")])
    assert refused.returncode == 2 and "missing: classifier.weight, classifier.bias" in refused.stderr
    assert "--allow-partial" in refused.stderr
    out = tmp_path / "partial.export"
    allowed = run([sys.executable, "-m", "export", str(headless), *base, "--out", str(out), "--allow-partial"])
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    proof = read_manifest_unchecked(out)["provenance"]
    assert proof["partial"] and proof["not_loaded"] == ["classifier.bias", "classifier.weight"]
    assert "PARTIAL" in allowed.stdout and "2 left at initialisation" in allowed.stdout


def test_a_task_handoff_does_not_serve_is_refused_naming_it(text_run: Path, tmp_path: Path):
    other = tmp_path / "qa"
    other.mkdir()
    config = json.loads((text_run / "base" / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["DistilBertForQuestionAnswering"]}))
    refused = export_state_dict(text_run, other, "--no-bento")
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1 and "question answering" in lines[0], refused.stderr
    assert "--model module:factory --example" in lines[0], "the route that works today is named"


def _copy_of_checkpoint(text_run: Path, to: Path) -> Path:
    """checkpoint-30's model, config and tokenizer (not its optimizer state), to change for one test."""
    keep = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    to.mkdir(parents=True)
    for file in (text_run / "checkpoint-30").iterdir():
        if file.name in keep:
            shutil.copy(file, to / file.name)
    return to


def test_checkpoint_files_that_are_links_or_odd_labels_are_refused_in_one_line(text_run: Path, tmp_path: Path):
    """Security round 4, items 6 and 12: a `vocab.txt` linked to a file outside the checkpoint shipped its lines as
    tokens, "parity passed"; id2label names skipped the class-name checks. Each is one line and exit 2 now."""
    linked = _copy_of_checkpoint(text_run, tmp_path / "linked")
    (linked / "vocab.txt").symlink_to("/etc/passwd")
    labels = _copy_of_checkpoint(text_run, tmp_path / "labels")
    config = json.loads((labels / "config.json").read_text())
    (labels / "config.json").write_text(json.dumps({**config, "id2label": {"0": "good", "1": "good"}}))
    for folder, needle in ((linked, "a link or not a regular file"), (labels, "id2label")):
        refused = run([sys.executable, "-m", "export", str(folder), "--no-bento", "--formats", "onnx"])
        lines = [line for line in refused.stderr.splitlines() if line.startswith("export:")]
        assert refused.returncode == 2 and len(lines) == 1 and needle in lines[0], refused.stderr[-2000:]
        assert "Traceback" not in refused.stderr


def test_a_tokenizer_that_is_not_the_models_is_refused(text_run: Path, tmp_path: Path):
    """Security round 4, items 7 and 13: a tokenizer whose words are all its unknown token answered every text of
    one length alike, "passed"; one without an unknown token was a traceback and exit 1."""
    blind = _copy_of_checkpoint(text_run, tmp_path / "blind")
    spec = json.loads((blind / "tokenizer.json").read_text())
    vocabulary = spec["model"]["vocab"]
    spec["model"]["vocab"] = {t: i for t, i in vocabulary.items() if t.startswith("[") or i < 10}  # words gone
    (blind / "tokenizer.json").write_text(json.dumps(spec))
    no_unknown = _copy_of_checkpoint(text_run, tmp_path / "no_unknown")
    spec = json.loads((no_unknown / "tokenizer.json").read_text())
    spec["model"]["vocab"] = {("[NOPE]" if t == "[UNK]" else t): i for t, i in spec["model"]["vocab"].items()}
    (no_unknown / "tokenizer.json").write_text(json.dumps(spec))
    for folder in (blind, no_unknown):
        refused = run([sys.executable, "-m", "export", str(folder), "--no-bento", "--formats", "onnx"])
        lines = [line for line in refused.stderr.splitlines() if line.startswith("export:")]
        assert refused.returncode == 2 and len(lines) == 1 and "tokenizer" in lines[0], refused.stderr[-2000:]
        assert "Traceback" not in refused.stderr


def test_only_ascii_digits_number_a_trainer_checkpoint(text_run: Path, tmp_path: Path):
    """Security round 4, item 12: `checkpoint-٩٩` (Arabic-Indic digits) won over checkpoint-30 as the newest."""
    out = tmp_path / "output"
    _copy_of_checkpoint(text_run, out / "checkpoint-30")
    _copy_of_checkpoint(text_run, out / "checkpoint-\u0669\u0669")
    from export.readers.hf_checkpoint import find_hf_checkpoint

    found = find_hf_checkpoint(out, None)
    assert found is not None and found.config_dir.name == "checkpoint-30"
