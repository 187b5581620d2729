"""A served language model against the in-process generation loop on the same model, side by side.

    python bench/generation_serving.py [--device cpu|cuda] [--seconds 8] [--rounds 3] [--tokens 64]
        [--export DIR]

Model: a Llama built from a config (hidden 256, 4 layers, 4 heads, 2 key-value heads, random weights) with a
byte-level BPE trained here on the Zen of Python and ChatML's template, saved with `save_pretrained` and exported by
`python -m export FOLDER` (no flags), or --export DIR. Prompts: 16 texts cut from the Zen of Python, 8 to 64 words.
Every request generates exactly --tokens tokens (`min_tokens` = `max_tokens`, greedy), so both sides do the same work.
Sides, each given the whole machine in turn, at concurrency 1 and 16:
- limit: no HTTP, no second process: the export's GenAI model opened as the service's engine opens it, and a bare
  loop of `og.Generator` calls on the prompts' ids, one thread per concurrent generation (the least work a
  generation takes here);
- ours: `bentoml serve` with serve/service.py, POST /v1/completions with `stream: true`, read by httpx.
Figures: generated tokens/s over all requests (the steady rate, after the first second), the time to the first
token (p50; the served side's is the first streamed chunk), and for ours the server's CPU per token.
Goal (issue 58): ours at c=16 at least 0.8 x the limit's tokens/s.

With --batched (issue 76), decoding instead of serving: ONNX Runtime GenAI's `Engine` (its scheduler decodes the
running requests in one model call a step: static batches on the CPU) against one `og.Generator` a request on a
thread of its own (what the service's engine process runs), both in process on the export's GenAI model, at
concurrency 1, 8 and 16 (as many requests kept in flight), with the first token's p50; and whether the Engine's
greedy tokens are the generators' for every prompt.

With --int4 (issue 76), precision instead of serving: the same export's int4 GenAI model (the builder's, as
`python -m export --int4` builds it, from the export's hf/ folder) against its fp32 one, both in the in-process loop,
at concurrency 1 and 8, each round in alternating order. The gate is not run here: a random model's near-uniform
choices would not hold it, and speed does not depend on it. Goal: int4 at least 2 x fp32's tokens/s at c=1 and c=8.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.load import tree_cpu_seconds  # noqa: E402
from bench.results import median_of_rounds, print_goal, print_ratios, side_order, write_result  # noqa: E402
from bench.text_serving import zen_words  # noqa: E402
from bench.workload import workload_name  # noqa: E402
from contract.generation import (  # noqa: E402
    GENAI_INT4_FOLDER,
    HF_FOLDER,
    TOKENIZER,
    GenerationSettings,
    PromptTokenizer,
)
from contract.manifest import read_artifact, read_manifest  # noqa: E402
from harness.server import BentoServer  # noqa: E402
from serve.model.generation import open_model, verified_copy  # noqa: E402

CONCURRENCY = (1, 16)
SIDES = ("limit", "ours")
GOAL = "ours >= 0.8 x the in-process loop's tokens/s at c=16"
PRECISION_CONCURRENCY = (1, 8)
BATCHED_CONCURRENCY = (1, 8, 16)
BATCHED_GOAL = "the Engine's batches give more tokens/s than a generator a request at c=8 and c=16"
INT4_GOAL = "int4 >= 2 x fp32's tokens/s at c=1 and c=8, in process"
WARM_S = 1.0


def make_model(folder: Path, *export_flags: str) -> Path:
    """A save_pretrained folder of a small random Llama with its chat tokenizer, exported with no flags (or
    `export_flags`)."""
    import torch
    import transformers

    from harness.tiny_text import EOS, TURN_END, bpe_chat_tokenizer

    torch.manual_seed(0)
    tokenizer = bpe_chat_tokenizer(zen_words(), vocab_size=1000, max_length=2048)
    eos = [tokenizer.convert_tokens_to_ids(TURN_END), tokenizer.convert_tokens_to_ids(EOS)]
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.architectures = ["LlamaForCausalLM"]
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config = transformers.GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos)
    saved = folder / "llama"
    model.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    out = folder / "llama.export"
    command = [sys.executable, "-m", "export", str(saved), "--out", str(out), "--no-bento", "--new-tokens", "8"]
    done = subprocess.run([*command, *export_flags], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"python -m export {saved} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return out


def make_prompts(count: int = 16) -> list[str]:
    words = zen_words()
    return [" ".join((words * 2)[(i * 7) % len(words) :][: 8 + (i * 8) % 57]) for i in range(count)]


class InProcessLoop:
    """The export's GenAI model and tokenizer, loaded as the service loads them (or the GenAI model in `model`, with
    the export's tokenizer), generating in bare loops."""

    def __init__(self, folder: Path, device: str, prompts: list[str], model: Path | None = None) -> None:
        manifest = read_manifest(folder)
        settings = GenerationSettings.from_manifest(manifest["generation"])
        tokenizer = PromptTokenizer(read_artifact(folder, manifest, TOKENIZER), settings)
        if model is not None:
            self.model, self.device = open_model(model, device)
        else:
            with verified_copy(folder, manifest) as private:
                self.model, self.device = open_model(private, device)
        self.prompts = [tokenizer.encode_prompt(p) for p in prompts]

    def one(self, ids: list[int], tokens: int) -> float:
        """One generation of exactly `tokens` tokens; the seconds to its first."""
        import onnxruntime_genai as og

        started = time.perf_counter()
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + tokens, min_length=len(ids) + tokens, do_sample=False)
        generator = og.Generator(self.model, params)
        generator.append_tokens(ids)
        first = 0.0
        while not generator.is_done():
            generator.generate_next_token()
            generator.get_next_tokens()
            first = first or time.perf_counter() - started
        return first

    def measure(self, concurrency: int, tokens: int, seconds: float) -> dict[str, Any]:
        done: list[tuple[float, int]] = []  # (when it ended, tokens)
        firsts: list[float] = []
        stop = threading.Event()
        started = time.perf_counter()

        def worker(k: int) -> None:
            i = k
            while not stop.is_set():
                firsts.append(self.one(self.prompts[i % len(self.prompts)], tokens))
                done.append((time.perf_counter(), tokens))
                i += concurrency

        with ThreadPoolExecutor(concurrency) as pool:
            futures = [pool.submit(worker, k) for k in range(concurrency)]
            time.sleep(seconds)
            stop.set()
            for future in futures:
                future.result()
        return summary(done, firsts, started, None)


class EngineLoop:
    """ONNX Runtime GenAI's Engine on the export's model: `concurrency` requests kept in flight, each decoded greedily
    to exactly `tokens` tokens, the Engine's steps run on one thread (module docstring)."""

    def __init__(self, folder: Path, prompts: list[str]) -> None:
        import onnxruntime_genai as og

        generators = InProcessLoop(folder, "cpu", prompts)
        self.model, self.prompts = generators.model, generators.prompts
        self.engine = og.Engine(self.model)
        self.buffer = self.engine.create_event_buffer(4096)

    def _start(self, ids: list[int], tokens: int) -> Any:
        import numpy as np
        import onnxruntime_genai as og

        request = self.engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(tokens)
        options.set_min_generated_tokens(tokens)
        options.set_do_sample(False)
        request.begin_turn(np.asarray(ids, dtype=np.int32), options)
        return request

    def measure(self, concurrency: int, tokens: int, seconds: float) -> dict[str, Any]:
        import onnxruntime_genai as og

        done: list[tuple[float, int]] = []
        firsts: list[float] = []
        started = time.perf_counter()
        flight: dict[int, tuple[Any, float, int]] = {}  # id(request): (request, when it began, tokens so far)
        for k in range(concurrency):
            request = self._start(self.prompts[k % len(self.prompts)], tokens)
            flight[id(request)] = (request, time.perf_counter(), 0)
        next_prompt = concurrency
        while flight:
            for event in self.engine.run(self.buffer):
                request, began, count = flight[id(event.request)]
                if count == 0:
                    firsts.append(time.perf_counter() - began)
                flight[id(request)] = (request, began, count + 1)
                if event.finish_reason != og.FinishReason.NONE:
                    del flight[id(request)]
                    request.close()
                    done.append((time.perf_counter(), count + 1))
                    if time.perf_counter() - started < seconds:
                        again = self._start(self.prompts[next_prompt % len(self.prompts)], tokens)
                        flight[id(again)] = (again, time.perf_counter(), 0)
                        next_prompt += 1
        return summary(done, firsts, started, None)

    def greedy(self, ids: list[int], tokens: int) -> list[int]:
        """One request's greedy tokens, alone on the Engine."""
        request, found = self._start(ids, tokens), []
        while self.engine.has_pending_requests():
            found += [int(event.token) for event in self.engine.run(self.buffer) if event.request is not None]
        request.close()
        return found


def summary(done: list[tuple[float, int]], firsts: list[float], started: float, cpu_s: float | None) -> dict:
    """Tokens/s after the warm-up (answers ending in the steady window), the first token's p50 and p90."""
    steady = [(t, n) for t, n in done if t - started >= WARM_S]
    span = (max(t for t, _ in steady) - started - WARM_S) if steady else 0.0
    tokens = sum(n for _, n in steady)
    figures = {
        "tokens_per_s": tokens / span if span > 0 else 0.0,
        "requests": len(done),
        "first_token_p50_ms": statistics.median(firsts) * 1000 if firsts else None,
        "first_token_p90_ms": statistics.quantiles(firsts, n=10)[-1] * 1000 if len(firsts) >= 10 else None,
    }
    if cpu_s is not None:
        figures["server_cpu_ms_per_token"] = cpu_s * 1000 / max(1, sum(n for _, n in done))
    return figures


async def load_served(url: str, prompts: list[str], concurrency: int, tokens: int, seconds: float) -> tuple:
    import httpx

    done: list[tuple[float, int]] = []
    firsts: list[float] = []
    started = time.perf_counter()
    deadline = started + seconds

    async def client(k: int, http: httpx.AsyncClient) -> None:
        i = k
        while time.perf_counter() < deadline:
            body = {"prompt": prompts[i % len(prompts)], "max_tokens": tokens, "min_tokens": tokens}
            body |= {"temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
            sent, first, used = time.perf_counter(), 0.0, 0
            async with http.stream("POST", url + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and not first:
                        first = time.perf_counter() - sent
                    if '"usage"' in line:
                        used = int(line.split('"completion_tokens":')[1].split(",")[0])
            firsts.append(first)
            done.append((time.perf_counter(), used))
            i += concurrency

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as http:
        await asyncio.gather(*(client(k, http) for k in range(concurrency)))
    return done, firsts, started


def measure_served(folder: Path, device: str, prompts: list[str], args: Any, log: Path) -> dict[str, Any]:
    with BentoServer(log, HANDOFF_MODEL_DIR=str(folder), HANDOFF_DEVICE=device, HANDOFF_MAX_GENERATIONS="16") as server:
        server.wait_ready()
        asyncio.run(load_served(server.url, prompts, 1, 4, 1.0))  # warm
        figures = {}
        for concurrency in CONCURRENCY:
            cpu_before = tree_cpu_seconds(server.proc.pid)
            done, firsts, started = asyncio.run(
                load_served(server.url, prompts, concurrency, args.tokens, args.seconds)
            )
            cpu = tree_cpu_seconds(server.proc.pid) - cpu_before
            figures[str(concurrency)] = summary(done, firsts, started, cpu)
        return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seconds", type=float, default=8.0, help="load per concurrency level, side and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64, help="tokens generated by every request")
    p.add_argument("--export", type=Path, help="serve this language model's export instead of a fresh Llama")
    p.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default: bench/results)")
    p.add_argument("--int4", action="store_true", help="int4 against fp32 in process instead (module docstring)")
    p.add_argument("--batched", action="store_true", help="the Engine's batches against a generator a request")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="generation-bench-"))
    folder = args.export.resolve() if args.export else make_model(work)
    prompts = make_prompts()
    if args.int4:
        return compare_precisions(folder, work, prompts, args)
    if args.batched:
        return compare_batching(folder, prompts, args)
    loop = InProcessLoop(folder, args.device, prompts)
    loop.measure(1, 4, 1.0)  # warm
    rounds = []
    for round_ in range(args.rounds):
        figures: dict[str, Any] = {}
        for side in side_order(list(SIDES), round_):
            if side == "limit":
                figures["limit"] = {str(c): loop.measure(c, args.tokens, args.seconds) for c in CONCURRENCY}
            else:
                figures["ours"] = measure_served(folder, args.device, prompts, args, work / f"ours{round_}.log")
        rounds.append(figures)
        for side in SIDES:
            for c in CONCURRENCY:
                f = figures[side][str(c)]
                print(
                    f"round {round_ + 1} {side:<6} c={c:<3} {f['tokens_per_s']:8.1f} tokens/s  first token p50 "
                    f"{f['first_token_p50_ms']:7.1f} ms"
                    + (f"  server CPU {f['server_cpu_ms_per_token']:.2f} ms/token" if side == "ours" else "")
                )
    median = median_of_rounds(rounds)
    ratios = {
        f"ours_over_limit_c{c}": median["ours"][str(c)]["tokens_per_s"] / median["limit"][str(c)]["tokens_per_s"]
        for c in CONCURRENCY
    }
    ratios |= {
        f"ours_first_token_over_limit_c{c}": median["ours"][str(c)]["first_token_p50_ms"]
        / median["limit"][str(c)]["first_token_p50_ms"]
        for c in CONCURRENCY
    }
    print_ratios(ratios)
    met = ratios["ours_over_limit_c16"] >= 0.8
    print_goal(GOAL, met)
    write_result(
        "generation_serving",
        workload=workload_name(args.export),
        folder=args.results_dir,
        figures={
            "device": args.device,
            "rounds": args.rounds,
            "tokens_per_request": args.tokens,
            "median": median,
            "per_round": rounds,
            "ratios": ratios,
            "goal": GOAL,
            "goal_met": met,
        },
    )
    return 0


def in_process_rounds(loops: dict[str, Any], levels: tuple[int, ...], args: Any) -> tuple[Any, list[Any]]:
    """Each loop measured at each concurrency of `levels`, the loops' order alternating by round; the median of
    the rounds and the rounds."""
    for loop in loops.values():
        loop.measure(1, 4, 1.0)  # warm
    rounds = []
    for round_ in range(args.rounds):
        figures = {
            side: {str(c): loops[side].measure(c, args.tokens, args.seconds) for c in levels}
            for side in side_order(list(loops), round_)
        }
        rounds.append(figures)
        print_round(round_, figures)
    return median_of_rounds(rounds), rounds


def print_round(round_: int, figures: dict[str, Any]) -> None:
    for side, by_level in figures.items():
        for c, f in by_level.items():
            first = f["first_token_p50_ms"]
            print(f"round {round_ + 1} {side:<16} c={c:<2} {f['tokens_per_s']:8.1f} tokens/s, first {first:.1f} ms")


def over(median: Any, ours: str, theirs: str, levels: tuple[int, ...], name: str) -> dict[str, float]:
    """`ours`' tokens/s and first token against `theirs`' at each level, as `{name}_over_..._c{level}` ratios."""
    mine, other = median[ours], median[theirs]
    ratios = {f"{name}_c{c}": mine[str(c)]["tokens_per_s"] / other[str(c)]["tokens_per_s"] for c in levels}
    first = name.replace("_over_", "_first_token_over_")
    ratios |= {
        f"{first}_c{c}": mine[str(c)]["first_token_p50_ms"] / other[str(c)]["first_token_p50_ms"] for c in levels
    }
    return ratios


def write_comparison(
    benchmark: str,
    workload: str,
    args: Any,
    compared: tuple[Any, list[Any], dict[str, float]],
    goal: str,
    met: bool,
    **more: Any,
) -> None:
    """The ratios and goal printed, and the result written (the median, every round, the ratios)."""
    median, rounds, ratios = compared
    print_ratios(ratios)
    print_goal(goal, met)
    figures = {"rounds": args.rounds, "tokens_per_request": args.tokens, **more, "median": median}
    figures |= {"per_round": rounds, "ratios": ratios, "goal": goal, "goal_met": met}
    write_result(benchmark, workload=workload, folder=args.results_dir, figures=figures)


def compare_batching(folder: Path, prompts: list[str], args: Any) -> int:
    """The Engine's batched decoding against a generator a request, in process (module docstring)."""
    loops: dict[str, Any] = {"generators": InProcessLoop(folder, "cpu", prompts), "engine": EngineLoop(folder, prompts)}
    same = sum(
        loops["engine"].greedy(ids, 16) == _generator_greedy(loops["generators"], ids, 16)
        for ids in loops["generators"].prompts
    )
    print(f"the Engine's greedy tokens are the generators' for {same} of {len(prompts)} prompts")
    median, rounds = in_process_rounds(loops, BATCHED_CONCURRENCY, args)
    ratios = over(median, "engine", "generators", BATCHED_CONCURRENCY, "engine_over_generators")
    met = ratios["engine_over_generators_c8"] > 1 and ratios["engine_over_generators_c16"] > 1
    workload = workload_name(args.export, "batched")
    compared = (median, rounds, ratios)
    equal = f"{same} of {len(prompts)}"
    write_comparison("generation_serving", workload, args, compared, BATCHED_GOAL, met, greedy_equal=equal)
    return 0


def _generator_greedy(loop: InProcessLoop, ids: list[int], tokens: int) -> list[int]:
    import onnxruntime_genai as og

    params = og.GeneratorParams(loop.model)
    params.set_search_options(max_length=len(ids) + tokens, min_length=len(ids) + tokens, do_sample=False)
    generator = og.Generator(loop.model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)[len(ids) :]]


def compare_precisions(folder: Path, work: Path, prompts: list[str], args: Any) -> int:
    """The export's fp32 GenAI model against its int4 twin, in process (module docstring)."""
    from export.genai_model import build_genai

    (work / HF_FOLDER).symlink_to(folder / HF_FOLDER, target_is_directory=True)
    build_genai(work, args.device, int4=True)
    loops = {
        "fp32": InProcessLoop(folder, args.device, prompts),
        "int4": InProcessLoop(folder, args.device, prompts, model=work / GENAI_INT4_FOLDER),
    }
    median, rounds = in_process_rounds(loops, PRECISION_CONCURRENCY, args)
    ratios = over(median, "int4", "fp32", PRECISION_CONCURRENCY, "int4_over_fp32")
    met = all(ratios[f"int4_over_fp32_c{c}"] >= 2.0 for c in PRECISION_CONCURRENCY)
    compared = (median, rounds, ratios)
    workload = workload_name(args.export, "int4")
    write_comparison("generation_serving", workload, args, compared, INT4_GOAL, met, device=args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
