#!/usr/bin/env bash
# Prepare, on a machine with internet, what the GPU check needs on a GPU machine without it.
#
#   bash scripts/gpu_wheels.sh     # -> .gpu_wheels/transfer-1 ... transfer-N, each at most 56 MiB
#
# The GPU machine already has Python 3.12, torch, torchvision, onnx and a CPU-only onnxruntime
# (scripts/gpu_image_packages.txt lists its packages); it lacks bentoml, onnxruntime-gpu and a few small
# packages. Only those are kept (~7 MB of wheels). The 255 MB onnxruntime-gpu wheel is unpacked and
# recompressed with xz (~203 MB: its CUDA kernels are already compressed, so xz gains only a fifth), then
# cut into parts. Each transfer-K folder fits one 64 MiB transfer with the working tree: carry them one
# call at a time (the machine keeps ignored files while it stays warm), then run
# `bash scripts/gpu_check.sh --out DIR` there, which unpacks and installs them (see docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu_wheels
transfer_mib=56  # a transfer carries 64 MiB with the working tree: room left for the tree
part_mib=52
staging="$(mktemp -d -t gpu-wheels-XXXXXX)"
trap 'rm -rf "$staging"' EXIT

# bentoml and the serving path's own needs as pyproject.toml pins them (orjson, the exact uvicorn,
# httptools; uvloop is in the image)
python3 -m pip download --quiet --dest "$staging" --only-binary=:all: --implementation cp --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any "bentoml==1.4.40" onnxruntime-gpu httpx "uvicorn==0.54.0" "orjson>=3.9" "httptools>=0.6,<1" \
  "transformers>=4.46,<6" tokenizers \
  "onnxruntime-genai-cuda==0.18.0" jinja2 \
  "soundfile==0.14.0" "av==18.1.1" "soxr==1.1.0"  # the Hugging Face steps (gpu_text.py, gpu_generation.py, gpu_tasks.py)

# Leave out what the image holds; keep the wheels of everything else.
mkdir -p "$staging/keep"
for wheel in "$staging"/*.whl; do
  name="$(basename "$wheel" | cut -d- -f1 | tr '[:upper:]_' '[:lower:]-')"
  if ! grep -qx -- "$name" scripts/gpu_image_packages.txt; then mv "$wheel" "$staging/keep/"; fi
done

# onnxruntime-gpu: a tar.xz of the wheel's contents (installed by unpacking it, as pip would), in parts.
ort="$(ls "$staging"/keep/onnxruntime_gpu-*.whl)"
mkdir "$staging/ort"
python3 -m zipfile -e "$ort" "$staging/ort"
rm "$ort"
tar -C "$staging/ort" -cf - . | xz -9 -T0 | split -b "${part_mib}m" - "$staging/onnxruntime_gpu.tar.xz.part-"

rm -rf "$dest"
k=0
for part in "$staging"/onnxruntime_gpu.tar.xz.part-*; do
  k=$((k + 1))
  mkdir -p "$dest/transfer-$k"
  mv "$part" "$dest/transfer-$k/"
done
# The other wheels, largest first, each into the first transfer with room (av's FFmpeg is ~37 MB), else a new one.
for wheel in $(ls -S "$staging"/keep/*.whl); do
  size=$(( $(stat -c %s "$wheel") / 1048576 + 1 ))
  placed=""
  for folder in "$dest"/transfer-*; do
    if [ $(( $(du -sm "$folder" | cut -f1) + size )) -le "$transfer_mib" ]; then placed="$folder"; break; fi
  done
  if [ -z "$placed" ]; then
    k=$((k + 1))
    placed="$dest/transfer-$k"
    mkdir -p "$placed"
  fi
  mv "$wheel" "$placed/"
done
du -sh "$dest"/transfer-* | sed 's/^/gpu_wheels: /'
