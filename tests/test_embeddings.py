"""Sentence embeddings end to end: a BERT encoder trained by Trainer under torchrun (2 gloo processes), its
checkpoint-N and its sentence-transformers folder exported with no flags, served on /embed (as
text-embeddings-inference answers), /v1/embeddings (as OpenAI's API answers) and the protocol, each vector equal to
the eager encoder's pooled the same way, on texts the export never saw."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
import tritonclient.http as triton
from conftest import Server

from contract.manifest import read_manifest_unchecked

pytestmark = pytest.mark.xdist_group("embeddings")

TEXTS = [
    "the film was a delight.",
    "the hotel did not cost much.",
    "our trip went on forever and I would say so to anyone who asked me about it at the end of the day",
    "Great!",
]
ATOL = 1e-4


def eager_vectors(folder: Path, texts: list[str], pooling: str) -> np.ndarray:
    """transformers' encoder on each text alone, pooled as sentence-transformers pools, normalised."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(folder, local_files_only=True).eval()
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, truncation=True, max_length=24, return_tensors="pt")
            hidden = model(**ids).last_hidden_state[0]
            pooled = hidden[0] if pooling == "cls" else hidden.mean(0)
            rows.append(torch.nn.functional.normalize(pooled, dim=0).numpy())
    return np.stack(rows)


@pytest.fixture(scope="module")
def server(embedding_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("embeddings") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(embedding_run / "checkpoint-20.export")) as srv:
        srv.wait_ready()
        yield srv


def test_both_layouts_export_with_no_flags_and_their_pooling(embedding_run: Path):
    plain = read_manifest_unchecked(embedding_run / "checkpoint-20.export")
    folder = read_manifest_unchecked(embedding_run / "st.export")
    for manifest in (plain, folder):
        assert manifest["task"] == "text-embedding" and manifest["status"] == "passed", manifest["parity"]["summary"]
        provenance = manifest["provenance"]
        assert provenance["pass"] and provenance["matched"] == provenance["model_tensors"] > 0, provenance
        assert all(check["pass"] for check in manifest["parity"]["text"])
        assert manifest["signature"]["outputs"][0]["name"] == "embeddings"
    assert plain["embedding"] == {"pooling": "mean", "normalized": True, "dimensions": 32}
    assert folder["embedding"] == {"pooling": "cls", "normalized": True, "dimensions": 32}


def test_embed_answers_as_the_eager_encoder_on_new_texts(server, embedding_run: Path):
    expected = eager_vectors(embedding_run / "checkpoint-20", TEXTS, "mean")
    together = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS, "truncate": True}, timeout=30)
    assert together.status_code == 200, together.text
    np.testing.assert_allclose(np.array(together.json()), expected, atol=ATOL)
    alone = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS[0]}, timeout=30).json()
    np.testing.assert_allclose(np.array(alone), expected[:1], atol=ATOL)
    assert np.linalg.norm(np.array(together.json()), axis=1) == pytest.approx(1.0, abs=1e-5)


def test_openai_embeddings_answer_as_the_api_does(server, embedding_run: Path):
    expected = eager_vectors(embedding_run / "checkpoint-20", TEXTS, "mean")
    answer = httpx.post(f"{server.url}/v1/embeddings", json={"input": TEXTS, "model": "mine"}, timeout=30)
    assert answer.status_code == 200, answer.text
    document = answer.json()
    assert document["object"] == "list" and document["model"] == "mine"
    assert [item["index"] for item in document["data"]] == list(range(len(TEXTS)))
    assert document["usage"]["prompt_tokens"] == document["usage"]["total_tokens"] > len(TEXTS)
    np.testing.assert_allclose(np.array([item["embedding"] for item in document["data"]]), expected, atol=ATOL)
    packed = httpx.post(
        f"{server.url}/v1/embeddings", json={"input": TEXTS[1], "encoding_format": "base64"}, timeout=30
    ).json()
    vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, expected[1], atol=ATOL)


def test_the_protocol_takes_texts_and_gives_vectors(server, embedding_run: Path):
    expected = eager_vectors(embedding_run / "checkpoint-20", TEXTS, "mean")
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    texts = triton.InferInput("text", [len(TEXTS)], "BYTES")
    texts.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
    vectors = client.infer("handoff", [texts]).as_numpy("embeddings")
    np.testing.assert_allclose(vectors, expected, atol=ATOL)
    metadata = client.get_model_metadata("handoff")
    assert [i["name"] for i in metadata["inputs"]] == ["text"]


def test_a_sentence_transformers_folder_is_served_with_its_own_pooling(embedding_run: Path, tmp_path: Path):
    expected = eager_vectors(embedding_run / "st", TEXTS[:2], "cls")
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(embedding_run / "st.export")) as srv:
        srv.wait_ready()
        answer = httpx.post(f"{srv.url}/embed", json={"inputs": TEXTS[:2]}, timeout=30)
    np.testing.assert_allclose(np.array(answer.json()), expected, atol=ATOL)


def test_wrong_embedding_requests_get_a_4xx_naming_the_problem(server):
    url = server.url
    cases = [
        ("/embed", {"inputs": []}, 400, "a list of texts"),
        ("/embed", {"inputs": [""]}, 400, "empty"),
        ("/embed", {"text": "hi"}, 400, '"inputs"'),
        ("/embed", {"inputs": "hi", "normalize": "yes"}, 400, "true or false"),
        ("/embed", {"inputs": [TEXTS[2] * 3]}, 413, "truncate"),
        ("/embed", {"inputs": ["hi"] * 1000}, 400, "HANDOFF_MAX_BATCH_SIZE"),
        ("/v1/embeddings", {"input": "hi", "dimensions": 7}, 400, "dimensions"),
        ("/v1/embeddings", {"input": "hi", "encoding_format": "int8"}, 400, "encoding_format"),
        ("/classify", {"text": "hi"}, 404, "/embed"),
    ]
    for route, body, status, words in cases:
        answer = httpx.post(f"{url}{route}", content=json.dumps(body), headers={"content-type": "application/json"})
        assert answer.status_code == status and words in answer.json()["error"], (route, body, answer.text)
    assert httpx.get(f"{url}/readyz").status_code == 200
    document = httpx.get(f"{url}/docs.json").json()
    assert document["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]["required"] == [
        "inputs"
    ]
