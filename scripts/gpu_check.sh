#!/usr/bin/env bash
# The GPU check in one command (at most ~8 minutes on one GPU): see scripts/gpu_check.py for the steps.
#
#   bash scripts/gpu_check.sh [--out DIR] [--dry-run-cpu] [--arch NAME]
#
# On the GPU machine (Python 3.12, torch and torchvision already installed, no internet), the packages the
# machine lacks (bentoml, onnxruntime-gpu, ...) come from .gpu_wheels/, prepared here by scripts/gpu_wheels.sh;
# a wheel split into parts for the 64 MiB transfers is put back together first. They go into a virtual
# environment that still sees the machine's torch (--system-site-packages). Without .gpu_wheels/, or with
# --dry-run-cpu, the current Python is used as it is (CI runs `--dry-run-cpu` in .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

out="" dry_run=0 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --dry-run-cpu) dry_run=1; extra+=(--dry-run-cpu); shift ;;
    --arch) extra+=(--arch "$2"); shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
out="${out:-$(mktemp -d -t gpu-check-XXXXXX)}"
mkdir -p "$out"

python="${PYTHON:-python3}"
if [ -x .venv/bin/python ]; then python=.venv/bin/python; fi
if [ "$dry_run" = 0 ] && [ -d .gpu_wheels ]; then
  for first in .gpu_wheels/*.whl.part-aa; do  # reassemble split wheels
    [ -e "$first" ] || continue
    whole="${first%.part-aa}"
    [ -e "$whole" ] || cat "${whole}".part-* > "$whole"
  done
  if [ ! -x .gpu_venv/bin/python ]; then
    python3 -m venv --system-site-packages .gpu_venv
    .gpu_venv/bin/pip install --quiet --no-index --find-links .gpu_wheels -r .gpu_wheels/requirements.txt
  fi
  python=.gpu_venv/bin/python
fi

# The project runs from this checkout (no install needed): train/main.py and bentoml find its packages here.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu_check: results in $out (python: $python)"
"$python" scripts/gpu_check.py --out "$out" "${extra[@]}" 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
