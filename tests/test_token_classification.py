"""Token classification end to end: a DistilBERT entity tagger trained by Trainer under torchrun (2 gloo processes),
its checkpoint-N exported with no flags, served on /classify and the protocol, its entities equal to transformers'
token-classification pipeline's on the same checkpoint (spans, labels, scores), on sentences the export never saw."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import transformers
import tritonclient.http as triton
from conftest import Server

from contract.manifest import read_manifest_unchecked

pytestmark = pytest.mark.xdist_group("tokens")

TEXTS = [
    "Alan Turing gave a talk in Cairo last year.",
    "Yesterday Grace Hopper and Niels Bohr visited New York .",
    "nobody lives here",
    "Ada Lovelace moved to Rio de Janeiro , then to London , then back to Paris and stayed there for good .",
]
ATOL = 1e-4


@pytest.fixture(scope="module")
def pipelines(token_run: Path):
    checkpoint = token_run / "checkpoint-40"
    model = transformers.AutoModelForTokenClassification.from_pretrained(checkpoint, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    return {
        strategy: transformers.pipeline(
            "token-classification", model=model, tokenizer=tokenizer, aggregation_strategy=strategy, device="cpu"
        )
        for strategy in ("simple", "none")
    }


@pytest.fixture(scope="module")
def server(token_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("tokens") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(token_run / "checkpoint-40.export")) as srv:
        srv.wait_ready()
        yield srv


def spans(entities: list[dict], kind: str) -> list[tuple]:
    return [(e[kind], int(e["start"]), int(e["end"])) for e in entities]


def test_the_trainer_checkpoint_exports_with_no_flags(token_run: Path):
    manifest = read_manifest_unchecked(token_run / "checkpoint-40.export")
    assert manifest["task"] == "token-classification" and manifest["status"] == "passed"
    assert manifest["labels"] == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    assert all(check["pass"] for check in manifest["parity"]["text"]), manifest["parity"]["summary"]
    # the library is the reference: the pipeline's token labels and scores on the parity texts
    assert manifest["parity"]["text"][-1]["check"] == "transformers pipeline"
    assert (
        manifest["reference"]["library"] == "transformers" and "token-classification" in manifest["reference"]["call"]
    )
    assert (
        manifest["provenance"]["pass"] and manifest["provenance"]["matched"] == manifest["provenance"]["model_tensors"]
    )


def test_entities_are_the_pipelines_grouped_and_per_token(server, pipelines):
    found = 0
    for text in TEXTS:
        for strategy, kind in (("simple", "entity_group"), ("none", "entity")):
            answer = httpx.post(f"{server.url}/classify", json={"text": text, "aggregation": strategy}, timeout=30)
            assert answer.status_code == 200, answer.text
            served, expected = answer.json()["entities"], pipelines[strategy](text)
            assert spans(served, kind) == spans(expected, kind), (text, strategy, served, expected)
            np.testing.assert_allclose([e["score"] for e in served], [e["score"] for e in expected], atol=ATOL)
            assert all(e["word"] == text[e["start"] : e["end"]] for e in served)
            found += len(served)
    assert found > 0, "the tagger found no entity anywhere: nothing was compared"
    plain = httpx.post(f"{server.url}/classify", content=TEXTS[0], headers={"content-type": "text/plain"}, timeout=30)
    as_json = httpx.post(f"{server.url}/classify", json={"text": TEXTS[0]}, timeout=30)
    assert plain.json() == as_json.json() and plain.json()["truncated"] is False


def test_the_protocol_gives_each_texts_entities_and_logits(server):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    texts = triton.InferInput("text", [len(TEXTS)], "BYTES")
    texts.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
    result = client.infer("handoff", [texts])
    logits, entities = result.as_numpy("logits"), result.as_numpy("entities")
    assert logits.shape[0] == len(TEXTS) and logits.shape[2] == 5
    for text, found in zip(TEXTS, entities, strict=True):
        alone = httpx.post(f"{server.url}/classify", json={"text": text}, timeout=30).json()["entities"]
        assert spans(json.loads(found), "entity_group") == spans(alone, "entity_group")


def test_wrong_token_requests_get_a_4xx_naming_the_problem(server):
    url = server.url
    answer = httpx.post(f"{url}/classify", json={"text": "Ada", "aggregation": "max"})
    assert answer.status_code == 400 and "aggregation" in answer.json()["error"]
    answer = httpx.post(f"{url}/classify", content=b"\x89PNG", headers={"content-type": "image/png"})
    assert answer.status_code == 415 and "entities" in answer.json()["error"]
    answer = httpx.post(f"{url}/embed", json={"inputs": "Ada"})
    assert answer.status_code == 404 and "/classify" in answer.json()["error"]
    assert httpx.get(f"{url}/readyz").status_code == 200
