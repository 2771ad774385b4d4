#!/usr/bin/env bash
# GPU check of issue 23 (bench/gpu_check.py does the work; its modules are bench/_gpu_*.py).
#
# 1. Here (the project venv, with the model and data packages; ~2 minutes on 2 cores):
#        bash bench/gpu_check.sh bundle [--out .aisp/gpu-bundle]
#    builds the file set for the GPU host (float16 MiniLM weights upcast at load, config, tokenizer,
#    the sentiment head, the 12,808 labelled reviews, CPU float32 reference scores of 2,048 of them,
#    a manifest of sha256s) and prints its size: refused over 60 MiB (a device run takes 64 MiB in
#    all, the ~5 MB working tree included). .aisp/ is git-ignored, so the bundle travels only when
#    carried.
# 2. On a lent device, with the session's `run` tool (one call; keep time to rerun it once):
#        carry:     [".aisp/gpu-bundle"]
#        command:   bash bench/gpu_check.sh run --bundle .aisp/gpu-bundle --out $OUT
#        timeout_s: 540
#    The GPU host has Python 3.12, torch (CUDA), transformers, tokenizers, numpy, safetensors, onnx,
#    nvidia-ml-py and a CPU-only onnxruntime; no PyFlink, Java, Kafka client or network. The check
#    loads only the PyFlink-free package parts (an import guard refuses the rest), runs phases
#    a-g (environment; fp32 vs the CPU reference; throughput of the plain PyTorch loop, the handler
#    and the runtime at batch 32/256/1,024 in fp32 and bf16 with NVML GPU busy; bf16 vs fp32 on all
#    51,232 rows; a forced OOM; the lease UUID check; ORT CUDA "not measured"), each under its own
#    deadline (--deadline-s, default 480 s in all), and rewrites $OUT/gpu_check.json and
#    $OUT/gpu_check.md after every phase, so a timeout still reports what ran.
# 3. Without a GPU (CI runs this through tests/unit/bench/test_gpu_check.py):
#        bash bench/gpu_check.sh bundle --out /tmp/b --sample 16
#        bash bench/gpu_check.sh run --bundle /tmp/b --out /tmp/r --cpu-only [--texts 64]
#
# Exit status of run: 0 no acceptance row failed; 1 a row failed (or the bundle is unusable);
# 2 no usable CUDA device (nothing timed; CPU numbers are never reported as GPU numbers).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
case "${1:-}" in
    bundle|run) ;;
    *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac

# the package from this checkout (the GPU host has no install of it)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PYTHON" bench/gpu_check.py "$@"
