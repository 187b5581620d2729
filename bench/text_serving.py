"""Served text models against the in-process limit (and, for a classifier, a plain BentoML peer), side by side.

    python bench/text_serving.py [--task classify|tokens|embed|rerank] [--device cpu|cuda] [--seconds 8]
        [--rounds 3] [--client wrk|httpx]

Model: a DistilBERT built from a config (dim 256, 4 layers, 4 heads, random weights; at most 128 tokens) with a
WordPiece tokenizer trained here on the Zen of Python, saved with `save_pretrained` and exported by
`python -m export FOLDER` (no flags) or --export DIR; by --task: a sequence classifier of 2 labels (`classify`,
POST /classify), a token classifier of 5 (`tokens`, POST /classify: entities), the encoder alone (`embed`, POST
/embed: mean-pooled vectors), a one-label cross-encoder (`rerank`, POST /rerank: a 6-word query and the text).
Texts: 32 sentences cut from the Zen of Python, 8, 16, 32 and 64 words long in turn (about 10 to 80 tokens),
one text per request.
Sides, each given the whole machine in turn:
- limit: no HTTP: the exported tokenizer (contract/tokenizer_spec.py, as the service uses it; pairs for `rerank`)
  and the ONNX Runtime session with the service's settings, on full batches of the same texts (each batch padded to
  its longest, or cut into like lengths as the service cuts it); on a CPU also lanes, a one-thread session called
  from a thread per core, as the service runs where its load-time timing finds that faster (serve/model/lanes.py); the
  fastest arrangement, timed again for --seconds;
- ours: `bentoml serve` with serve/service.py, the task's route, one text per request;
- ours_oip (`classify`): the same service through the Open Inference Protocol's binary infer, a BYTES `text` [1];
- peer_batched (`classify`): bench/peer/text_batched.py, what BentoML's adaptive-batching guide leads to, with the
  same tokenizer and session.
Goal (issues 43 and 56): ours at c=64 at least 0.8 x the limit (and ahead of the peer, for `classify`).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.checks import assert_provider  # noqa: E402
from bench.load import Upload, load_levels, wrk_available  # noqa: E402
from bench.results import median_of_rounds, print_goal, print_ratios  # noqa: E402
from bench.serving import (  # noqa: E402
    measure_rounds,
    over_limit,
    over_peers,
    paired_over_limit,
    print_sides,
    served_provider,
    write_serving_result,
)
from contract.manifest import read_manifest_unchecked  # noqa: E402
from contract.tokenizer_spec import TextTokenizer, TokenizerSettings  # noqa: E402
from harness.server import BentoServer  # noqa: E402
from harness.tiny_text import wordpiece_tokenizer  # noqa: E402
from serve.config import usable_cores  # noqa: E402
from serve.model.runtime import onnx_providers, onnx_session_options  # noqa: E402
from serve.tasks.texts import PaddedSequences  # noqa: E402

CONCURRENCY = (1, 64)
SIDES = ("ours", "ours_oip", "peer_batched")
# --task: the transformers class built, its labels, and the route a client calls
TASKS = {
    "classify": ("AutoModelForSequenceClassification", ("negative", "positive"), "/classify"),
    "tokens": ("AutoModelForTokenClassification", ("O", "B-PER", "I-PER", "B-LOC", "I-LOC"), "/classify"),
    "embed": ("AutoModel", (), "/embed"),
    "rerank": ("AutoModelForSequenceClassification", ("score",), "/rerank"),
}
QUERY_WORDS = 6  # `rerank`: the query, the first words of each text's neighbour
BATCH_SIZES = (1, 8, 32)
WORDS_PER_TEXT = (8, 16, 32, 64)
GOAL = "ours >= 0.8 x limit at c=64 and ahead of peer_batched"
TASK_GOAL = "ours >= 0.8 x limit at c=64"  # the tasks with no peer


def zen_words() -> list[str]:
    """The Zen of Python's words (its text is rot13 in `this.s`; importing it prints it, hence the redirect)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13").split()


def make_texts(count: int = 32) -> list[str]:
    words = zen_words()
    texts = []
    for i in range(count):
        length = WORDS_PER_TEXT[i % len(WORDS_PER_TEXT)]
        start = (i * 7) % len(words)
        texts.append(" ".join((words * 2)[start : start + length]))
    return texts


def make_model(folder: Path, *export_flags: str, task: str = "classify") -> Path:
    """A save_pretrained folder (config, weights, tokenizer) of `task`'s model exported with no flags (or
    `export_flags`), as a user would; the folder's name is `distilbert`, its export's `distilbert.export`."""
    import torch
    import transformers

    torch.manual_seed(0)
    auto_class, labels, _ = TASKS[task]
    tokenizer = wordpiece_tokenizer(zen_words(), vocab_size=400, max_length=128)
    # num_labels, id2label and label2id are PretrainedConfig's keyword arguments, which its stubs do not declare
    config = transformers.DistilBertConfig(  # type: ignore[call-arg]
        vocab_size=len(tokenizer),
        dim=256,
        n_layers=4,
        n_heads=4,
        hidden_dim=1024,
        max_position_embeddings=128,
        num_labels=max(1, len(labels)),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        pad_token_id=tokenizer.pad_token_id,
    )
    trained = folder / "distilbert"
    getattr(transformers, auto_class).from_config(config).save_pretrained(trained)
    tokenizer.save_pretrained(trained)
    out = folder / "distilbert.export"
    command = [sys.executable, "-m", "export", str(trained), "--formats", "onnx", "--out", str(out), "--no-bento"]
    done = subprocess.run([*command, *export_flags], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"python -m export {trained} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return out


class InProcessText:
    """The export's tokenizer and ONNX session, loaded the way the service loads them."""

    def __init__(self, folder: Path, device: str, task: str = "classify") -> None:
        import onnxruntime as ort

        self.pairs = task == "rerank"
        settings = TokenizerSettings.from_manifest(read_manifest_unchecked(folder)["tokenizer"])
        self.tokenizer = TextTokenizer((folder / settings.file).read_bytes(), settings)
        self.shape = PaddedSequences(settings)
        self.session = ort.InferenceSession(
            str(folder / "model.onnx"), onnx_session_options(), providers=onnx_providers(device)
        )
        assert_provider("limit", self.session.get_providers(), device)
        # Lanes (serve/model/lanes.py): one one-thread session called from a thread per core, as the service runs it
        # when its load-time timing finds that faster; a CPU arrangement.
        cores = usable_cores() if device == "cpu" else 1
        self.lanes = ThreadPoolExecutor(cores) if cores > 1 else None
        self.narrow = ort.InferenceSession(str(folder / "model.onnx"), onnx_session_options(1)) if self.lanes else None

    def encode(self, texts: list[str]) -> dict[str, Any]:
        if self.pairs:
            return self.tokenizer.encode_pairs([(query_of(text), text) for text in texts]).rows
        return self.tokenizer.encode(texts).rows

    def run(self, batches: list[list[str]]) -> None:
        for batch in batches:
            self.session.run(None, self.encode(batch))

    def run_grouped(self, batches: list[list[str]], session: Any = None) -> None:
        """Each batch as the service runs it: every text tokenized alone, the batch cut into calls of like lengths
        (serve/tasks/texts.py, PaddedSequences.groups)."""
        for batch in batches:
            parts = [self.encode([text]) for text in batch]
            for group in self.shape.groups(parts):
                (session or self.session).run(None, self.shape.join([parts[i] for i in group]))

    def run_in_lanes(self, batches: list[list[str]]) -> None:
        """run_grouped on the one-thread session, the batches dealt out to the lanes, every lane at once."""
        assert self.lanes is not None
        count = self.lanes._max_workers
        shares = [batches[k::count] for k in range(count)]
        for done in [self.lanes.submit(self.run_grouped, share, self.narrow) for share in shares if share]:
            done.result()


def query_of(text: str) -> str:
    """`rerank`'s query for a text: the first words of the text itself (a query that shares its words)."""
    return " ".join(text.split()[:QUERY_WORDS])


def _rate(run: Callable[[list[list[str]]], None], texts: list[str], size: int, count: int) -> dict[str, float]:
    batches = [[texts[(i * size + j) % len(texts)] for j in range(size)] for i in range(max(1, count // size))]
    run(batches[:1])  # warm this batch size
    wall, cpu = time.perf_counter(), time.process_time()
    run(batches)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = sum(len(b) for b in batches)
    return {"images_per_s": done / wall, "cpu_ms_per_image": 1000 * cpu / done}


def limit_round(model: InProcessText, texts: list[str], seconds: float) -> dict[str, Any]:
    """The sweep (96 texts each: batches of 1, 8 and 32 as they come, and of 32 cut into like lengths as the
    service cuts them, and in lanes, of 8 and 32), the fastest timed again for `seconds`, and one text alone."""
    arrangements = {f"batch {size}": (model.run, size) for size in BATCH_SIZES}
    arrangements["batch 32 by length"] = (model.run_grouped, 32)
    if model.lanes is not None:
        arrangements |= {f"lanes, batch {size} by length": (model.run_in_lanes, size) for size in (8, 32)}
    swept = {name: _rate(run, texts, size, 96) for name, (run, size) in arrangements.items()}
    best = max(swept, key=lambda name: swept[name]["images_per_s"])
    run, size = arrangements[best]
    limit = _rate(run, texts, size, int(swept[best]["images_per_s"] * seconds))
    single = []
    for i in range(30):
        started = time.perf_counter()
        model.run([[texts[i % len(texts)]]])
        single.append(time.perf_counter() - started)
    return {
        **limit,
        "best": best,
        "swept": {name: round(r["images_per_s"], 1) for name, r in swept.items()},
        "single_image_ms": 1000 * statistics.median(single),
    }


def requests_for(name: str, texts: list[str], task: str = "classify") -> list[Upload]:
    if name == "ours":
        bodies = {
            "/classify": lambda t: {"text": t},
            "/embed": lambda t: {"inputs": t},
            "/rerank": lambda t: {"query": query_of(t), "texts": [t]},
        }[TASKS[task][2]]
        return [
            Upload(TASKS[task][2], {"Content-Type": "application/json"}, json.dumps(bodies(t)).encode()) for t in texts
        ]
    if name == "peer_batched":
        return [
            Upload("/classify", {"Content-Type": "application/json"}, json.dumps({"texts": [t]}).encode())
            for t in texts
        ]
    uploads = []
    for text in texts:  # the protocol's binary infer, as tritonclient sends a BYTES [1] input
        data = text.encode()
        binary = len(data).to_bytes(4, "little") + data
        header = json.dumps(
            {
                "inputs": [
                    {"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(binary)}}
                ]
            }
        ).encode()
        uploads.append(
            Upload("/v2/models/handoff/infer", {"Inference-Header-Content-Length": str(len(header))}, header + binary)
        )
    return uploads


def start(name: str, folder: Path, device: str, log: Path) -> BentoServer:
    if name == "peer_batched":
        return BentoServer(
            log,
            target="text_batched:TextBatchedPeer",
            cwd=ROOT / "bench" / "peer",
            PEER_MODEL_DIR=str(folder),
            PEER_DEVICE=device,
        )
    return BentoServer(log, target=None, cwd=ROOT, bentoml=None, HANDOFF_MODEL_DIR=str(folder), HANDOFF_DEVICE=device)


def measure(name: str, folder: Path, device: str, log: Path, texts: list[str], args: Any) -> dict[str, Any]:
    with start(name, folder, device, log) as server:
        result: dict[str, Any] = {"ready_s": server.wait_ready()}
        assert_provider(name, [served_provider(name, server.url)], device)
        result.update(
            load_levels(
                args.client,
                server.url,
                server.proc.pid,
                requests_for(name, texts, args.task),
                CONCURRENCY,
                args.seconds,
            )
        )
        return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=tuple(TASKS), default="classify", help="the model and route (module docstring)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seconds", type=float, default=8.0, help="load per concurrency level, side and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--client", choices=("wrk", "httpx"), default="wrk" if wrk_available() else "httpx")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=None, help="(default: all for classify, else ours)")
    p.add_argument("--export", type=Path, help="serve this text export instead of a fresh DistilBERT (default)")
    p.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default: bench/results)")
    args = p.parse_args(argv)
    args.sides = args.sides or (list(SIDES) if args.task == "classify" else ["ours"])
    if args.task != "classify" and set(args.sides) != {"ours"}:
        p.error(f"--task {args.task}: the side is ours (the protocol's side and the peer are a classifier's)")
    work = Path(tempfile.mkdtemp(prefix="text-bench-"))
    folder = args.export.resolve() if args.export else make_model(work, task=args.task)
    texts = make_texts()
    model = InProcessText(folder, args.device, args.task)
    rounds = measure_rounds(
        args.rounds,
        args.sides,
        lambda: limit_round(model, texts, args.seconds),
        lambda name, round_, _: measure(name, folder, args.device, work / f"{name}{round_}.log", texts, args),
        unit="texts",
    )
    median = median_of_rounds(rounds)
    limit = median["limit"]
    print(
        f"limit (in-process, median of {args.rounds} rounds): {limit['images_per_s']:.1f} texts/s; "
        f"one text alone {limit['single_image_ms']:.1f} ms; "
        f"best per round: {', '.join(r['limit']['best'] for r in rounds)}"
    )
    print_sides(median, args.sides, CONCURRENCY, unit="texts")
    ratios = over_limit(median, args.sides, CONCURRENCY)
    peers = [p for p in ("peer_batched",) if p in args.sides]
    ratios |= over_peers(median, [n for n in ("ours", "ours_oip") if n in args.sides], peers, CONCURRENCY)
    print_ratios(ratios)
    figures = {
        "client": args.client,
        "task": f"{args.task} ({TASKS[args.task][2]})",
        "texts": f"{len(texts)} texts of {', '.join(map(str, WORDS_PER_TEXT))} words",
    }
    figures |= paired_over_limit(rounds, args.sides)
    goal = None
    if "ours" in args.sides and "peer_batched" in args.sides:
        goal = ratios["ours_over_limit_c64"] >= 0.8 and ratios["ours_over_peer_batched_c64"] > 1
    elif args.task != "classify":
        goal = ratios["ours_over_limit_c64"] >= 0.8
    goal_text = GOAL if args.task == "classify" else TASK_GOAL
    print_goal(goal_text, goal)
    seconds = {"limit_one_text": limit["single_image_ms"] / 1000}
    for name in args.sides:
        seconds[f"{name}_p50_c1"] = median[name]["1"]["p50_ms"] / 1000
    report = {"ratios": ratios, "seconds": seconds, "figures": figures, "goal": goal_text, "goal_met": goal}
    variant = "" if args.task == "classify" else args.task
    write_serving_result("text_serving", args, rounds, median, args.sides, report, variant)
    return 0


if __name__ == "__main__":
    sys.exit(main())
