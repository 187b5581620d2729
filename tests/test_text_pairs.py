"""Text pairs end to end: a BERT cross-encoder trained on (query, passage) pairs by Trainer under torchrun (2 gloo
processes), exported with no flags (one label: a reranker), served on /rerank (as text-embeddings-inference
answers), /classify with `text_pair` (as transformers' pipeline takes it) and the protocol's two BYTES inputs, each
score equal to the eager model's on pairs the export never saw, long ones truncated as transformers truncates them.
And a classifier of single texts exported with --text-pairs."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
import tritonclient.http as triton
from conftest import Server, run

from contract.manifest import read_manifest_unchecked

pytestmark = pytest.mark.xdist_group("pairs")

QUERY = "what did you think of the hotel?"
PASSAGES = [
    "the hotel was wonderful.",
    "the meal did not cost much.",
    "the hotel went on forever",
    "Fine.",
    # past the model's 24 tokens: with the long query below, both overflow an odd budget (24 - 3)
    "the show was awful and the hotel was wonderful and our trip went on forever and this book did not cost much.",
]
LONG_QUERY = "what did you think of the hotel, the show, the game and the meal on our trip this year, all in all?"
ATOL = 1e-4
EXPORT = [sys.executable, "-m", "export"]


@pytest.fixture(scope="module")
def eager(pair_run: Path):
    """The trained cross-encoder as transformers loads it: each pair's logit, the reference every answer is held to."""
    checkpoint = pair_run / "checkpoint-80"
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint, local_files_only=True).eval()

    def logit(query: str, passage: str) -> float:
        with torch.no_grad():
            ids = tokenizer(query, passage, truncation=True, max_length=24, return_tensors="pt")
            return float(model(**ids).logits[0, 0])

    return logit


@pytest.fixture(scope="module")
def server(pair_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("pairs") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(pair_run / "checkpoint-80.export")) as srv:
        srv.wait_ready()
        yield srv


def sigmoid(x: float) -> float:
    return float(1 / (1 + np.exp(-x)))


def test_a_one_logit_classifier_exports_with_no_flags_as_a_reranker_of_pairs(pair_run: Path):
    manifest = read_manifest_unchecked(pair_run / "checkpoint-80.export")
    assert manifest["task"] == "text-ranking" and manifest["status"] == "passed", manifest["parity"]["summary"]
    assert manifest["tokenizer"]["pairs"] is True
    assert manifest["tokenizer"]["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    provenance = manifest["provenance"]
    assert provenance["pass"] and provenance["matched"] == provenance["model_tensors"] > 0, provenance
    assert [check["pass"] for check in manifest["parity"]["text"]] == [True, True, True], manifest["parity"]["text"]
    assert manifest["parity"]["text"][-1]["check"] == "sentence-transformers CrossEncoder"  # its predict()
    assert manifest["reference"]["library"] == "sentence-transformers"


def test_rerank_ranks_texts_by_the_eager_models_score(server, eager):
    answer = httpx.post(
        f"{server.url}/rerank", json={"query": QUERY, "texts": PASSAGES, "truncate": True, "return_text": True}
    )
    assert answer.status_code == 200, answer.text
    ranks = answer.json()
    expected = [sigmoid(eager(QUERY, passage)) for passage in PASSAGES]
    assert [r["index"] for r in ranks] == sorted(range(len(PASSAGES)), key=lambda i: -expected[i])
    for rank in ranks:
        assert rank["score"] == pytest.approx(expected[rank["index"]], abs=ATOL)
        assert rank["text"] == PASSAGES[rank["index"]]
    raw = httpx.post(
        f"{server.url}/rerank", json={"query": LONG_QUERY, "texts": PASSAGES, "truncate": True, "raw_scores": True}
    )
    assert raw.status_code == 200, raw.text
    for rank in raw.json():  # both texts past the maximum: the odd token goes to the longer in full
        assert rank["score"] == pytest.approx(eager(LONG_QUERY, PASSAGES[rank["index"]]), abs=ATOL)
        assert "text" not in rank


def test_classify_takes_a_pair_as_the_pipeline_does_and_one_text_says_what_it_needs(server, eager, pair_run: Path):
    passage = PASSAGES[0]
    answer = httpx.post(f"{server.url}/classify", json={"text": QUERY, "text_pair": passage})
    assert answer.status_code == 200, answer.text
    [prediction] = answer.json()["predictions"]  # Trainer's one-label head is a regression: the logit, as the pipeline
    assert read_manifest_unchecked(pair_run / "checkpoint-80.export")["scores"] == "none"
    assert prediction["score"] == pytest.approx(eager(QUERY, passage), abs=ATOL) and "probability" not in prediction
    pipeline = transformers.pipeline("text-classification", model=str(pair_run / "checkpoint-80"))
    assert pipeline({"text": QUERY, "text_pair": passage})["score"] == pytest.approx(prediction["score"], abs=ATOL)
    for kwargs in ({"json": {"text": QUERY}}, {"content": QUERY.encode(), "headers": {"content-type": "text/plain"}}):
        alone = httpx.post(f"{server.url}/classify", **kwargs)
        assert alone.status_code == 400 and "text_pair" in alone.json()["error"], alone.text


def test_the_protocol_takes_two_bytes_inputs_a_pair_per_row(server, eager):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    metadata = client.get_model_metadata("handoff")
    assert [i["name"] for i in metadata["inputs"]] == ["text", "text_pair"]
    queries = [QUERY, LONG_QUERY, "how was the game?"]
    passages = [PASSAGES[0], PASSAGES[4], PASSAGES[3]]
    given = []
    for name, texts in (("text", queries), ("text_pair", passages)):
        tensor = triton.InferInput(name, [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
        given.append(tensor)
    result = client.infer("handoff", given, outputs=[triton.InferRequestedOutput("logits")])
    expected = [eager(q, p) for q, p in zip(queries, passages)]
    np.testing.assert_allclose(result.as_numpy("logits")[:, 0], expected, atol=ATOL)
    with pytest.raises(Exception, match="text_pair"):
        client.infer("handoff", given[:1])


def test_wrong_rerank_requests_get_a_4xx_naming_the_problem(server):
    url = f"{server.url}/rerank"
    cases = [
        ({"query": QUERY, "texts": PASSAGES}, 413, "truncate"),  # the long passage, not truncated unless asked
        ({"query": QUERY}, 400, "expected a JSON object"),
        ({"query": QUERY, "texts": []}, 400, "at least one"),
        ({"query": QUERY, "texts": ["a"], "top_n": 2}, 400, "unknown field"),
        ({"query": "", "texts": ["a"]}, 400, "empty"),
        ({"query": QUERY, "texts": ["a", 7]}, 400, "texts[1]"),
        ({"query": QUERY, "texts": ["a"], "raw_scores": "yes"}, 400, "true or false"),
        ({"query": QUERY, "texts": ["a"] * 1000}, 400, "HANDOFF_MAX_BATCH_SIZE"),
    ]
    for body, status, words in cases:
        answer = httpx.post(url, json=body, timeout=30)
        assert answer.status_code == status and words in answer.json()["error"], (body, answer.text)
    assert server.status("/readyz") == 200


def test_a_classifier_of_single_texts_exports_with_text_pairs_and_is_proved_on_pairs(text_run: Path, tmp_path: Path):
    out = tmp_path / "pairs.export"
    done = run([*EXPORT, str(text_run / "checkpoint-30"), "--text-pairs", "--out", str(out), "--no-bento"])
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest_unchecked(out)
    assert manifest["task"] == "text-classification" and manifest["tokenizer"]["pairs"] is True
    assert manifest["status"] == "passed" and all(check["pass"] for check in manifest["parity"]["text"])


def test_text_pairs_is_refused_for_a_model_that_does_not_read_texts_in_pairs(token_run: Path, tmp_path: Path):
    done = run([*EXPORT, str(token_run / "checkpoint-40"), "--text-pairs", "--out", str(tmp_path / "x"), "--no-bento"])
    assert done.returncode != 0 and "--text-pairs" in done.stderr.strip().splitlines()[-1], done.stderr[-800:]
    assert not (tmp_path / "x").exists()


def _with_activation(pair_run: Path, tmp_path: Path, activation: str) -> Path:
    """The cross-encoder's checkpoint as sentence-transformers' CrossEncoder saves one with `activation_fn`."""
    folder = tmp_path / "checkpoint-80"
    shutil.copytree(pair_run / "checkpoint-80", folder, ignore=shutil.ignore_patterns("optimizer.pt", "rng_*"))
    config = json.loads((folder / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": activation, "version": "6.3.0"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_rerank_scores_as_the_folders_cross_encoder_predicts(pair_run: Path, tmp_path: Path):
    """A CrossEncoder saved with the identity as its activation predicts raw logits; /rerank answers as it does."""
    from sentence_transformers import CrossEncoder

    folder = _with_activation(pair_run, tmp_path, "torch.nn.modules.linear.Identity")
    out = tmp_path / "identity.export"
    done = run([*EXPORT, str(folder), "--out", str(out), "--no-bento", "--formats", "onnx"])
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest_unchecked(out)
    assert manifest["rerank_scores"] == "none" and manifest["reference"]["library"] == "sentence-transformers"
    query, texts = QUERY, PASSAGES
    expected = CrossEncoder(str(folder), device="cpu").predict([(query, text) for text in texts])
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(out)) as srv:
        srv.wait_ready()
        ranks = httpx.post(f"{srv.url}/rerank", json={"query": query, "texts": texts, "truncate": True}).json()
    assert {r["index"]: r["score"] for r in ranks} == pytest.approx(dict(enumerate(expected.tolist())), abs=1e-4)
    assert np.abs(expected - 1 / (1 + np.exp(-expected))).max() > 0.1  # the sigmoid's scores would differ


def test_a_cross_encoder_activation_handoff_does_not_apply_is_refused(pair_run: Path, tmp_path: Path):
    folder = _with_activation(pair_run, tmp_path, "torch.nn.modules.activation.Tanh")
    done = run([*EXPORT, str(folder), "--out", str(tmp_path / "x"), "--no-bento"])
    assert done.returncode == 2 and "Tanh" in done.stderr.strip().splitlines()[-1], done.stderr[-800:]
    assert not (tmp_path / "x").exists()
