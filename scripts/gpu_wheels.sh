#!/usr/bin/env bash
# Prepare, on a machine with internet, the wheels the GPU check needs on a GPU machine without it.
#
#   bash scripts/gpu_wheels.sh            # -> .gpu_wheels/ (cp312, manylinux x86_64), about 400 MB
#
# The GPU machine already has Python 3.12, torch, torchvision, onnx and onnxscript; it lacks bentoml,
# onnxruntime-gpu and the smaller packages listed below. Wheels over 56 MiB (onnxruntime-gpu is ~255 MB)
# are split into NAME.part-aa, -ab, ... so that each fits one 64 MiB transfer; scripts/gpu_check.sh
# puts them back together there. Transfer the folder's files over as many calls as needed, then run
# `bash scripts/gpu_check.sh --out DIR` there (see the README, "Checking the GPU path").
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu_wheels
mkdir -p "$dest"
cat > "$dest/requirements.txt" <<'REQ'
bentoml>=1.4,<1.5
onnxruntime-gpu
safetensors
scikit-learn
matplotlib
tqdm
pillow
httpx
REQ
python3 -m pip download --quiet --dest "$dest" --only-binary=:all: --implementation cp --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -r "$dest/requirements.txt"
for wheel in "$dest"/*.whl; do
  if [ "$(stat -c %s "$wheel")" -gt $((56 * 1024 * 1024)) ]; then
    split -b 56m "$wheel" "$wheel.part-"
    rm "$wheel"
  fi
done
ls -l "$dest" | awk '{s += $5} END {printf "gpu_wheels: %d files, %.0f MB in '"$dest"'\n", NR - 1, s / 1e6}'
