"""Export a checkpoint to ONNX, torch.export (pt2), TorchScript and safetensors, and prove numerical parity.

    python -m export runs/demo/last.pt                       # a handoff checkpoint: no flags needed
    python -m export model_best.pth.tar                      # the ImageNet example's checkpoint (arch inside)
    python -m export output/model_29.pth --ema               # torchvision's references, their EMA weights
    python -m export output/train/*/model_best.pth.tar       # timm's train.py (timm's preprocessing)
    python -m export outputs/checkpoint/step-1000            # torch.distributed.checkpoint (FSDP2, torchtitan)
    python -m export weights.pth --arch resnet50             # a bare state_dict, DDP-prefixed or not
    python -m export weights.pth --arch timm/convnext_atto   # the same, of a timm model
    python -m export model.pt --trust-pickle                 # a whole pickled nn.Module (only if you trust it)
    python -m export out/checkpoint-30                       # Hugging Face Trainer's checkpoint, with its tokenizer
    python -m export state.pt --hf-config base-model/        # a DDP state_dict of a Hugging Face model

Exit status: 0 exported and parity passed; 2 bad input or usage (one line on stderr, nothing written), the
weights not the checkpoint's whole model included; 3 parity failed (report printed, folder written with status
"failed", never registered); 4 parity compared nothing (a detector that finds nothing anywhere, a model that
answers every input alike: status "not checked", never registered; 0 with --accept-unchecked).

Every export first proves provenance: each parameter and buffer of the exported model equals the checkpoint's
tensor of that name (tied weights only where the model declares them), and every model tensor of the checkpoint
was used; the manifest's `provenance` and the report's first line say so.

This module is the command line's parser; export/options.py turns what it parsed into typed options, checked
without torch. The export itself
(export/run.py) imports torch, about 7 s of CPU here: a mistyped option, a bad number or a missing labels file
is answered before that, in a fraction of a second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contract.manifest import DEFAULT_FORMATS, FORMATS
from export import bento
from export.int4_gate import DEFAULT_GATE

EXIT_BAD_INPUT = 2  # EXIT_OK (0) and EXIT_PARITY (3) come with the writers


def bad_input(err: Exception) -> int:
    """The one-line answer to bad input or usage, and its exit status."""
    print(f"export: error: {err}", file=sys.stderr)
    return EXIT_BAD_INPUT


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export",
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n" + __doc__.split("\n\n")[1] + "\n\n" + __doc__.split("\n\n")[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    read = p.add_argument_group("what to read")
    read.add_argument(
        "checkpoint",
        type=Path,
        nargs="+",
        help="a .pt/.pth/.pth.tar/.ckpt/.bin/.safetensors file, or a folder: "
        "torch.distributed.checkpoint (FSDP2, torchtitan step-N) or Accelerate save_state; several (one per "
        "node, say) are compared tensor by tensor first: identical, the first is exported; different, exit 2",
    )
    read.add_argument(
        "--pick",
        type=int,
        default=None,
        help="with several checkpoints that differ: export the Nth (1-based) anyway (default: refuse)",
    )
    read.add_argument(
        "--arch",
        default=None,
        help="when the checkpoint does not name one: a torchvision classifier "
        "(resnet50), or timm/NAME for a timm model; a bare name always means torchvision's, also where "
        "timm has the same name (a timm checkpoint's own arch is read as timm's)",
    )
    read.add_argument(
        "--ema",
        action="store_true",
        help="export the EMA weights (torchvision's model_ema, timm's "
        "state_dict_ema, any *ema* state) instead of the trained ones (default: trained)",
    )
    read.add_argument(
        "--model",
        default=None,
        help="module:factory that builds your own nn.Module (called with num_classes= when it takes it)",
    )
    read.add_argument(
        "--example",
        type=Path,
        default=None,
        help="any model (with --model): a .pt (weights_only) or .npz holding one tensor or a dict of named "
        "tensors: the inputs' names, dtypes and shapes, and the values parity runs on; dimension 0 is the batch",
    )
    read.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="NAME:DIM[,DIM]",
        help="with --example: more dynamic dimensions of input NAME besides the batch, e.g. tokens:1 for a "
        "sequence length (repeatable, once per input)",
    )
    read.add_argument(
        "--image-size", type=int, default=None, help="input side, when the checkpoint does not say (default: 224)"
    )
    for side, default in (("min", 800), ("max", 1333)):
        read.add_argument(
            f"--{side}-size",
            type=int,
            default=None,
            help=f"a torchvision detector built with {side}_size= (default: its args' {side}_size, else the "
            f"builder's, {default} for the R-CNNs)",
        )
    read.add_argument(
        "--labels",
        type=Path,
        default=None,
        help="class names, one per line, in index order (default: the checkpoint's, else 0..N-1)",
    )
    read.add_argument(
        "--hf-config",
        type=Path,
        default=None,
        help="a Hugging Face model whose checkpoint holds no config.json (a plain DDP state_dict, an Accelerate "
        "save_state folder): the folder its model was built from (save_pretrained, or a checkpoint-N)",
    )
    read.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="a Hugging Face model: the folder its tokenizer was saved to (default: beside the config or weights)",
    )
    read.add_argument(
        "--text-pairs",
        action="store_true",
        help="a Hugging Face text classifier that reads only pairs of texts: served on "
        '{"text": ..., "text_pair": ...}, never one text alone (default: a classifier whose tokenizer encodes pairs '
        "takes a text or a pair, as transformers' pipeline does; a one-logit cross-encoder is a reranker)",
    )
    read.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="a Hugging Face config that needs the model's own code (auto_map): allow it; this runs code from the "
        "folder (default: refused)",
    )
    read.add_argument(
        "--allow-partial",
        action="store_true",
        help="a deliberate partial load (a re-initialised head): export even though some model tensors are not in "
        "the checkpoint or some checkpoint tensors fit nowhere; the manifest's provenance lists both (default: "
        "refused, naming the first few)",
    )
    read.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow full unpickling; this runs code from the "
        "file, so only for files you trust (default: off, weights_only=True)",
    )
    write = p.add_argument_group("what to write")
    write.add_argument(
        "--out",
        type=Path,
        default=None,
        help="export folder (default: beside the checkpoint, <checkpoint name>.export)",
    )
    write.add_argument(
        "--formats",
        default=",".join(DEFAULT_FORMATS),
        help="comma-separated subset of "
        + ",".join(FORMATS)
        + f" (default: {','.join(DEFAULT_FORMATS)}). onnx: what the service runs; "
        "pt2: torch.export, for torch users (torch.export.load); aoti: compiled ahead of time (C++, "
        "~30 s, opt-in); torchscript: deprecated upstream, kept for stacks that still load it",
    )
    write.add_argument(
        "--fp16",
        action="store_true",
        help="export half-precision artifacts, checked with fp16 tolerances (default: fp32)",
    )
    write.add_argument(
        "--name",
        default=bento.DEFAULT_NAME,
        help=f"model name in the BentoML model store (default: {bento.DEFAULT_NAME})",
    )
    write.add_argument(
        "--no-bento",
        action="store_true",
        help="do not register the result in the BentoML model store (default: register)",
    )
    check = p.add_argument_group("parity check")
    check.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the eager reference runs; auto: CUDA when present (default: auto)",
    )
    check.add_argument(
        "--samples",
        type=Path,
        default=None,
        help="folder of real images for the parity check "
        "(default: the training data when the checkpoint names it, else scikit-learn's sample photos)",
    )
    check.add_argument(
        "--int8",
        action="store_true",
        help="also write model.int8.onnx: ONNX Runtime's static "
        "INT8 quantization (QDQ, per-channel), calibrated on the training data the checkpoint names "
        "(else --samples), kept only if accuracy holds (see --max-accuracy-drop)",
    )
    check.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=1.0,
        help="INT8: the most top-1 it may lose, in "
        "percentage points, on the validation set (or in agreement with fp32); past it, exit 3 and "
        "the INT8 artifact is marked failed and never served (default: 1.0)",
    )
    check.add_argument(
        "--accept-unchecked",
        action="store_true",
        help="exit 0 when parity compared nothing (no detection on any input, the same answer for every input); "
        "the folder is still marked 'not checked' and the service will not serve it (default: exit 4)",
    )
    check.add_argument(
        "--own-reference",
        action="store_true",
        help="where the checkpoint's own library is not installed (sentence-transformers for its folders), compare "
        "the export with handoff's own model of it instead; the manifest says so (default: refuse, naming what to "
        "install)",
    )
    check.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help="a language model: a JSON file of your own prompts for its parity, each a string (a completion) or a "
        'list of {"role", "content"} messages (a chat), besides the built-in ones',
    )
    check.add_argument(
        "--new-tokens",
        type=int,
        default=24,
        help="a language model: the tokens generated per prompt in its parity (default: 24)",
    )
    check.add_argument(
        "--int4",
        action="store_true",
        help="a language model: also build its int4 GenAI model (block-wise MatMulNBits, weights in blocks of 32) and "
        "serve it in place of the fp32 one if it holds the accuracy gate against it on the parity prompts and yours "
        "(--prompts): every first difference of the two greedy generations a near-tie, fp32's greedy tokens chosen "
        "alike up to each first difference at least --int4-min-agreement of the time, fp32's continuations' "
        "log-likelihood down by at most --int4-max-loglik-drop; past it, exit 3 and the int4 model is not written "
        "(docs/generation.md)",
    )
    check.add_argument(
        "--int4-min-agreement",
        type=float,
        default=DEFAULT_GATE.min_agreement,
        help="--int4's gate: the least share of fp32's greedy tokens int4 must choose too, up to each prompt's first "
        "difference; it falls with --new-tokens (a model agreeing at 93%% of steps scores about 0.5 over 24 tokens) "
        f"(default: {DEFAULT_GATE.min_agreement})",
    )
    check.add_argument(
        "--int4-max-loglik-drop",
        type=float,
        default=DEFAULT_GATE.max_loglik_drop,
        help="--int4's gate: the most the mean log-likelihood of fp32's greedy continuations may drop under int4, in "
        f"nats a token (default: {DEFAULT_GATE.max_loglik_drop})",
    )
    check.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: 1e-4, fp16 5e-2)")
    check.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: 1e-3, fp16 5e-2)")
    return p
