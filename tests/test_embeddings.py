"""Sentence embeddings end to end: a BERT encoder trained by Trainer under torchrun (2 gloo processes), its
checkpoint-N and its sentence-transformers folders (2.x-5.x's layout, and 6.x's as the library saves it) exported
with no flags, served on /embed (as text-embeddings-inference answers), /v1/embeddings (as OpenAI's API answers) and
the protocol, each vector equal to the eager encoder's pooled the same way, and a folder's equal to what
`SentenceTransformer(folder).encode` answers (its length limit, its prompts, the modules modules.json names), on
texts the export never saw; what the export does not reproduce refused in one line."""

from __future__ import annotations

import base64
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
from conftest import Server, assert_serves_only_its_routes, run
from sentence_transformers import SentenceTransformer

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


def library_vectors(folder: Path, texts: list[str], prompt_name: str | None = None) -> np.ndarray:
    """What a user of a sentence-transformers folder gets: its own encode()."""
    return SentenceTransformer(str(folder), device="cpu", local_files_only=True).encode(texts, prompt_name=prompt_name)


def test_every_layout_exports_with_no_flags_and_its_pooling(embedding_run: Path):
    plain = read_manifest_unchecked(embedding_run / "checkpoint-20.export")
    folder = read_manifest_unchecked(embedding_run / "st.export")
    folder6 = read_manifest_unchecked(embedding_run / "st6.export")
    for manifest in (plain, folder, folder6):
        assert manifest["task"] == "text-embedding" and manifest["status"] == "passed", manifest["parity"]["summary"]
        provenance = manifest["provenance"]
        assert provenance["pass"] and provenance["matched"] == provenance["model_tensors"] > 0, provenance
        assert all(check["pass"] for check in manifest["parity"]["text"])
        assert manifest["signature"]["outputs"][0]["name"] == "embeddings"
    no_prompts = {"prompts": {}, "default_prompt_name": None}
    assert plain["embedding"] == {"pooling": "mean", "normalized": True, "dimensions": 32} | no_prompts
    assert folder["embedding"] == {"pooling": "cls", "normalized": True, "dimensions": 32} | no_prompts
    prompts = {"query": "query: ", "passage": "passage: ", "document": ""}
    assert folder6["embedding"] == {
        "pooling": "mean",
        "normalized": True,
        "dimensions": 32,
        "prompts": prompts,
        "default_prompt_name": "query",
    }
    assert folder["tokenizer"]["max_length"] == folder6["tokenizer"]["max_length"] == 16  # not the tokenizer's 24
    assert plain["reference"]["library"] == "handoff" and "no sentence-transformers folder" in str(plain["reference"])
    for manifest in (folder, folder6):
        assert manifest["reference"]["library"] == "sentence-transformers" and manifest["reference"]["version"]
        assert [c["check"] for c in manifest["parity"]["text"]][-1] == "sentence-transformers encode"
    assert folder6["read"] == [
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
        "2_Normalize/config.json",
        "config_sentence_transformers.json",
    ]


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
    answer = httpx.post(f"{server.url}/v1/embeddings", json={"input": TEXTS, "model": "handoff"}, timeout=30)
    assert answer.status_code == 200, answer.text
    document = answer.json()
    assert document["object"] == "list" and document["model"] == "handoff"
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


def test_a_sentence_transformers_folder_is_served_as_its_encode_answers(embedding_run: Path, tmp_path: Path):
    """2.x-5.x's folder: CLS pooling and texts cut at its max_seq_length (16), not the tokenizer's 24."""
    expected = library_vectors(embedding_run / "st", TEXTS)
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(embedding_run / "st.export")) as srv:
        srv.wait_ready()
        answer = httpx.post(f"{srv.url}/embed", json={"inputs": TEXTS, "truncate": True}, timeout=30)
    np.testing.assert_allclose(np.array(answer.json()), expected, atol=ATOL)


def test_a_sentence_transformers_6_folder_is_served_with_its_prompts(embedding_run: Path, tmp_path: Path):
    folder = embedding_run / "st6"
    default, passage = library_vectors(folder, TEXTS), library_vectors(folder, TEXTS, "passage")
    assert np.abs(default - passage).max() > 100 * ATOL  # the prompt changes the vectors
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(embedding_run / "st6.export")) as srv:
        srv.wait_ready()
        embed = httpx.post(f"{srv.url}/embed", json={"inputs": TEXTS, "truncate": True}, timeout=30)
        np.testing.assert_allclose(np.array(embed.json()), default, atol=ATOL)
        named = {"inputs": TEXTS, "truncate": True, "prompt_name": "passage"}
        np.testing.assert_allclose(np.array(httpx.post(f"{srv.url}/embed", json=named).json()), passage, atol=ATOL)
        openai = httpx.post(f"{srv.url}/v1/embeddings", json={"input": TEXTS, "prompt_name": "passage"}).json()
        np.testing.assert_allclose(np.array([d["embedding"] for d in openai["data"]]), passage, atol=ATOL)
        client = triton.InferenceServerClient(srv.url.removeprefix("http://"))
        texts = triton.InferInput("text", [len(TEXTS)], "BYTES")
        texts.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
        np.testing.assert_allclose(client.infer("handoff", [texts]).as_numpy("embeddings"), default, atol=ATOL)
        too_long = httpx.post(f"{srv.url}/embed", json={"inputs": [TEXTS[2]]})  # 16 tokens with its prompt
        assert too_long.status_code == 413 and "16" in too_long.json()["error"], too_long.text
        unknown = httpx.post(f"{srv.url}/embed", json={"inputs": ["hi"], "prompt_name": "classify"})
        assert unknown.status_code == 400 and "query" in unknown.json()["error"], unknown.text
        assert httpx.get(f"{srv.url}/info").json()["model"]["embedding"]["default_prompt_name"] == "query"


def _st6_copy(embedding_run: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "st6"
    shutil.copytree(embedding_run / "st6", folder)
    return folder


def _export(folder: Path, tmp_path: Path):
    out = tmp_path / "out.export"
    done = run([sys.executable, "-m", "export", str(folder), "--out", str(out), "--no-bento", "--formats", "onnx"])
    return done, out


def test_each_module_is_read_from_the_path_modules_json_gives(embedding_run: Path, tmp_path: Path):
    folder = _st6_copy(embedding_run, tmp_path)
    shutil.move(folder / "1_Pooling", folder / "mean_pooling")  # what modules.json will name
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": "cls"}))
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["path"] = "mean_pooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    done, out = _export(folder, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest_unchecked(out)
    assert manifest["embedding"]["pooling"] == "mean" and manifest["status"] == "passed"
    assert "mean_pooling/config.json" in manifest["read"] and "1_Pooling/config.json" not in manifest["read"]


@pytest.mark.parametrize(
    ("path", "change", "words"),
    [
        ("1_Pooling/config.json", {"pooling_mode": "max"}, "pooling ['max']"),
        ("1_Pooling/config.json", {"include_prompt": False}, "include_prompt"),
        ("sentence_bert_config.json", {"do_lower_case": True}, "do_lower_case"),
        ("config_sentence_transformers.json", {"model_type": "SparseEncoder"}, "SparseEncoder"),
        ("modules.json", [{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}], "Dense"),
    ],
)
def test_what_sentence_transformers_would_do_and_handoff_does_not_is_refused(
    embedding_run: Path, tmp_path: Path, path: str, change, words: str
):
    folder = _st6_copy(embedding_run, tmp_path)
    found = json.loads((folder / path).read_text())
    (folder / path).write_text(json.dumps(found + change if isinstance(change, list) else found | change))
    done, out = _export(folder, tmp_path)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and words in last, done.stderr[-1500:]
    assert not out.exists()


def test_an_encoder_documents_and_answers_its_own_routes_alone(server):
    assert_serves_only_its_routes(server.url, {"POST /embed", "POST /v1/embeddings", "POST /predict"})
    assert httpx.post(f"{server.url}/classify", json={"text": "hi"}).status_code == 404


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
        ("/v1/embeddings", {"input": "hi", "model": "text-embedding-3-small"}, 404, "does not exist"),  # round 5
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


def test_a_pytorch_model_bin_beside_the_safetensors_is_set_aside_and_said(embedding_run: Path, tmp_path: Path):
    """transformers loads model.safetensors first; a disagreeing pytorch_model.bin beside it is named as set aside."""
    from safetensors.torch import load_file

    folder = tmp_path / "checkpoint-20"
    shutil.copytree(embedding_run / "checkpoint-20", folder)
    weights = load_file(str(folder / "model.safetensors"))
    torch.save({name: tensor + 1 for name, tensor in weights.items()}, folder / "pytorch_model.bin")
    done, out = _export(folder, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest_unchecked(out)
    assert manifest["source"]["set_aside"] == [
        "pytorch_model.bin: model.safetensors is read first, as transformers reads it"
    ]
    assert "pytorch_model.bin is set aside" in done.stderr
    files = manifest["source"]["files"]  # every file of the folder, with what the export did with it
    assert files["pytorch_model.bin"].startswith("set aside: model.safetensors is read first")
    assert files["model.safetensors"] == "read: the weights" and files["optimizer.pt"].startswith("set aside")
    assert (
        manifest["provenance"]["sha256"]
        == read_manifest_unchecked(embedding_run / "checkpoint-20.export")["provenance"]["sha256"]
    )  # the same tensors as without the .bin
