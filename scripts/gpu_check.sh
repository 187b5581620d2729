#!/usr/bin/env bash
# The GPU check in one command (at most ~8 minutes on one GPU): see scripts/gpu_check.py for the steps.
#
#   bash scripts/gpu_check.sh [--out DIR] [--dry-run-cpu] [other options of scripts/gpu_check.py]
#
# On the GPU machine (Python 3.12, torch and torchvision already installed, no internet), the packages the
# machine lacks (bentoml, onnxruntime-gpu, ...) come from .gpu_wheels/transfer-*/, prepared here by
# scripts/gpu_wheels.sh; they are unpacked into .gpu_site/, put on PYTHONPATH ahead of the machine's own.
# Without .gpu_wheels/, or with --dry-run-cpu, the current Python is used as it is (CI runs `--dry-run-cpu`
# in .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

out="" dry_run=0 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --dry-run-cpu) dry_run=1; extra+=(--dry-run-cpu); shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) extra+=("$1"); shift ;;  # for scripts/gpu_check.py (--arch, --bench-seconds, ...), which checks them
  esac
done
out="${out:-$(mktemp -d -t gpu-check-XXXXXX)}"
mkdir -p "$out"

python="${PYTHON:-python3}"
if [ -x .venv/bin/python ]; then python=.venv/bin/python; fi
site=""
if [ "$dry_run" = 0 ] && [ -d .gpu_wheels ]; then
  # A folder on PYTHONPATH rather than a virtual environment: a venv made from the machine's Python (itself a
  # venv) would not see that venv's torch. PYTHONPATH comes first, so onnxruntime-gpu wins over the CPU one.
  site="$PWD/.gpu_site"
  if [ ! -d "$site/bentoml" ]; then
    transfers=(.gpu_wheels/transfer-*)
    echo "gpu_check: installing ${#transfers[@]} transfers from .gpu_wheels into $site"
    mkdir -p "$site"
    cat .gpu_wheels/transfer-*/onnxruntime_gpu.tar.xz.part-* | "$python" -c \
      'import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall(sys.argv[1], filter="data")' \
      "$site"
    "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" .gpu_wheels/transfer-*/*.whl
  fi
fi

# The project runs from this checkout (no install needed): train/main.py and bentoml find its packages here.
export PYTHONPATH="$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu_check: results in $out (python: $python)"
"$python" scripts/gpu_check.py --out "$out" "${extra[@]}" 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
