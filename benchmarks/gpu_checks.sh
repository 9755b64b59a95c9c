#!/usr/bin/env bash
# One-shot GPU checks for a session that is lent a CUDA device (the device tool's `run`): calibrate on the
# GPU, show measured over datasheet, profile two zoo models in bf16 with CUDA-kernel attribution, and keep
# every artifact under $OUT. Sized for a few minutes on an H100 / H200; nothing here runs in CI.
#
#   OUT=/tmp/gpu bash benchmarks/gpu_checks.sh
#
# The GPU image has torch (2.11, Python 3.12) but maybe not opmap's small pure-Python dependencies, and no
# network: prepare them here with `.venv/bin/pip install --target gpu_deps typer rich tomli-w` and carry
# gpu_deps (the device tool's `carry`); this script puts src/ and gpu_deps/ on PYTHONPATH.
set -uo pipefail
export PYTHONPATH="src:gpu_deps:${PYTHONPATH:-}"
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
run() { echo "+ $*" | tee -a "$OUT/log.txt"; "$@" 2>&1 | tee -a "$OUT/log.txt"; }
export XDG_CACHE_HOME="$OUT/cache"
run $PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
run $PY -m opmap.cli calibrate --device cuda --out "$OUT/local-cuda.toml"
run $PY -m opmap.cli profile gpt2 --device cuda --dtype bf16 --seq 1024 --hardware "$OUT/local-cuda.toml" \
    --iters 30 --profile-iters 5 --out "$OUT/gpt2"
run $PY -m opmap.cli profile resnet50 --device cuda --dtype bf16 --batch 32 --hardware "$OUT/local-cuda.toml" \
    --iters 30 --profile-iters 5 --out "$OUT/resnet50"
run $PY -m opmap.cli profile gpt2 --device cuda --dtype bf16 --seq 512 --train --hardware "$OUT/local-cuda.toml" \
    --iters 10 --profile-iters 3 --out "$OUT/gpt2-train"
# issue 10's GEMM and attention shapes, timed with CUDA events beside the catalog prediction, the steady-load
# GEMMs, and issue 22's attention-dropout lead (p 0.1 / p 0 per SDPA backend at the GPT runs' shapes):
# gpu_measure.json
run $PY benchmarks/gpu_measure.py
# datasheet-only prediction beside the measured run (no calibration): how far the catalog alone gets
run $PY -m opmap.cli analyze gpt2 --hardware h200 --dtype bf16 --seq 1024 --fusion eager --out "$OUT/gpt2-h200-eager"
rm -f "$OUT"/*/torch_trace.json  # large; trace.json keeps the joined view
