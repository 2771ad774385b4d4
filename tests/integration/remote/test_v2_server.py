"""Issue 22: the V2 handler against a real KServe ModelServer (the ``v2_server`` fixture), directly and
through the fault-injecting proxy (:class:`pyflink_aisp.chaos.FaultProxy`): outputs equal the same
graph in process; 429 / 503 are waited out and retried, nothing lost; bodies that are not the
protocol's and answers past the deadline are the rows' dead letters; the job through the proxy
writes every record once."""

from __future__ import annotations

import itertools
import json
import math
import time

import numpy as np
import pytest

from pyflink_aisp.chaos import FaultProxy, Faults
from pyflink_aisp.errors import RemoteError, RemoteTimeoutError
from pyflink_aisp.inference.handlers import OnnxPredictorHandler
from pyflink_aisp.inference.handlers.remote import CallLogConfig, LimiterConfig, V2PredictorHandler
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline.flink import build_pipeline, make_environment

pytestmark = pytest.mark.integration
INFER = "/v2/models/intent_head/infer"


@pytest.fixture(scope="module")
def local(v2_server, embeddings):
    """The same graph in process: its predictions for every embedding."""
    handler = OnnxPredictorHandler(model_path=v2_server[1])
    return handler.run_inference(list(embeddings), handler.load_model())


def _same(got, want):
    assert got["label"] == want["label"]
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-6)


def test_the_served_model_answers_as_the_graph_in_process_several_rows_per_request(
        run_handler, v2_server, embeddings, local):
    with FaultProxy(v2_server[0]) as proxy:
        handler = V2PredictorHandler(url=proxy.url, model="intent_head", rows_per_request=16)
        assert [f.name for f in handler.task().fields] == ["label", "probabilities"]
        out, session = run_handler(handler, embeddings, batch=100)
    for got, want in zip(out, local, strict=True):
        _same(got, want)
    assert proxy.requests(INFER) == 6 * math.ceil(100 / 16) == session.stats.requests
    assert proxy.counts[("/v2/models/intent_head", "forwarded")] == 2  # the job's client and the worker


def test_the_binary_tensor_extension_answers_as_the_json_lists(run_handler, v2_server, embeddings, local):
    with FaultProxy(v2_server[0]) as proxy:
        handler = V2PredictorHandler(url=proxy.url, model="intent_head", rows_per_request=16, binary=True)
        out, session = run_handler(handler, embeddings, batch=100)
    for got, want in zip(out, local, strict=True):
        _same(got, want)
    assert proxy.requests(INFER) == 6 * math.ceil(100 / 16) == session.stats.requests
    # the server answered in the extension too: the outputs' bytes after a JSON header
    import httpx

    from pyflink_aisp.inference.handlers.remote._v2 import _binary_body

    body = _binary_body(handler.check(), embeddings[:3], ["label", "probabilities"])
    answer = httpx.post(f"{v2_server[0]}{INFER}", content=body.content, headers=body.headers)
    length = int(answer.headers["inference-header-content-length"])
    header = json.loads(answer.content[:length])
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [
        sum(4 + len(row["label"].encode()) for row in local[:3]), 3 * 157 * 4]


def test_a_fixed_request_rate_spaces_the_requests_the_server_sees(run_handler, v2_server, embeddings, local):
    started = time.time()
    with FaultProxy(v2_server[0]) as proxy:
        handler = V2PredictorHandler(url=proxy.url, model="intent_head", rows_per_request=1,
                                     concurrency=LimiterConfig(initial=8, maximum=8, max_requests_per_s=10))
        out, _ = run_handler(handler, embeddings[:12], batch=12)  # 12 requests, 8 slots: the rate holds them
    for got, want in zip(out, local[:12], strict=True):
        _same(got, want)
    arrivals = proxy.arrivals["/v2/models/intent_head/infer"]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert len(arrivals) == 12 and min(gaps) >= 0.08, gaps  # 1 / 10 s, less the clocks' slack
    assert started <= proxy.first_request_since(started, "/infer") == arrivals[0]
    assert proxy.first_request_since(time.time() + 1, "/infer") is None


def test_rate_limits_and_overload_are_waited_out_and_nothing_is_lost(
        run_handler, v2_server, embeddings, local):
    faults = Faults(rate_limited=0.3, unavailable=0.1, retry_after_s=1, path_suffix="/infer", seed=3)
    with FaultProxy(v2_server[0], faults) as proxy:
        handler = V2PredictorHandler(url=proxy.url, model="intent_head", rows_per_request=8)
        out, session = run_handler(handler, embeddings[:320])
    assert not [p for p in out if isinstance(p, BaseException)]
    for got, want in zip(out, local[:320], strict=True):
        _same(got, want)
    hit = sum(n for (path, what), n in proxy.counts.items() if path == INFER and what != "forwarded")
    assert hit > 0 and session.stats.retries == hit  # each refused attempt was tried again, once
    assert proxy.counts[(INFER, "forwarded")] == 320 // 8  # and every request went through once
    assert session.limiter.decreases > 0 and session.stats.throttled_s >= 1.0


def test_a_body_that_is_not_the_protocols_is_a_remote_error_of_its_rows_and_not_retried(
        run_handler, v2_server, embeddings):
    with FaultProxy(v2_server[0]) as proxy:
        handler = V2PredictorHandler(url=proxy.url, model="intent_head", rows_per_request=10)
        proxy.set_faults(Faults(truncated=1.0, path_suffix="/infer"))
        out, _ = run_handler(handler, embeddings[:30])
    assert all(isinstance(p, RemoteError) and not isinstance(p, RemoteTimeoutError) for p in out)
    assert "not JSON" in str(out[0]) and out[0].status == 200
    assert proxy.requests(INFER) == 3


def test_a_rewriting_proxy_forwards_and_counts_the_rewritten_path(v2_server, embeddings, local):
    import httpx

    drop = lambda path: path.replace("/versions/latest/infer", "/infer")  # noqa: E731
    body = {"inputs": [{"name": "embedding", "shape": [2, 384], "datatype": "FP32",
                        "data": embeddings[:2].ravel().tolist()}]}
    with FaultProxy(v2_server[0]) as plain, FaultProxy(v2_server[0], rewrite=drop) as gateway:
        versioned = "/v2/models/intent_head/versions/latest/infer"
        assert httpx.post(f"{plain.url}{versioned}", json=body).status_code == 501
        answer = httpx.post(f"{gateway.url}{versioned}", json=body)
    assert answer.status_code == 200
    labels = next(o for o in answer.json()["outputs"] if o["name"] == "label")["data"]
    assert labels == [local[0]["label"], local[1]["label"]]
    assert gateway.requests(INFER) == 1 and gateway.requests("/versions/latest/infer") == 0


def test_the_test_server_answers_a_versioned_path_when_told_to(v2_server, embeddings, local, tmp_path):
    """``kserve_onnx.py --any-version`` (what the bench's Flink ML_PREDICT, which always names a version,
    is served by): the versioned infer path answers as the plain one."""
    import sys
    from pathlib import Path

    import httpx

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "servers"))
    try:
        import launch
    finally:
        sys.path.pop(0)
    body = {"inputs": [{"name": "embedding", "shape": [2, 384], "datatype": "FP32",
                        "data": embeddings[:2].ravel().tolist()}]}
    server = launch.kserve_server({"intent_head": v2_server[1]}, tmp_path / "kserve.log", any_version=True)
    with server as url:
        answer = httpx.post(f"{url}/v2/models/intent_head/versions/latest/infer", json=body)
    assert answer.status_code == 200
    labels = next(o for o in answer.json()["outputs"] if o["name"] == "label")["data"]
    assert labels == [local[0]["label"], local[1]["label"]]


def test_answers_past_the_deadline_are_remote_timeouts(run_handler, v2_server, embeddings):
    with FaultProxy(v2_server[0]) as proxy:
        handler = V2PredictorHandler(url=proxy.url, model="intent_head", rows_per_request=10,
                                     request_timeout_s=0.5, deadline_s=1.5)
        proxy.set_faults(Faults(slow=1.0, slow_s=3.0, path_suffix="/infer"))
        out, _ = run_handler(handler, embeddings[:20])
    assert all(isinstance(p, RemoteTimeoutError) for p in out)
    assert "1.5 s deadline" in str(out[0]) and "timed out" in str(out[0])


def test_the_job_through_a_rate_limiting_proxy_writes_every_record_once(
        kafka_bootstrap, topic, v2_server, embeddings, local):
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in, t_out])
    n = 400
    records = [{"tx": f"t{i}", "embedding": embeddings[i].tolist()} for i in range(n)]
    assert ingest_records(kafka_bootstrap, t_in, records, progress=False).delivered == n
    # every request of the model's metadata (the job's start-up checks) may be limited too: they retry
    with FaultProxy(v2_server[0], Faults(rate_limited=0.3, retry_after_s=1, seed=5)) as proxy:
        cfg = PipelineOptions.from_args([
            "--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--output-topic", t_out,
            "--mode", "batch", "--feature-fields", "/embedding", "--id-field", "/tx",
            "--remote-url", proxy.url, "--remote-model", "intent_head", "--remote-rows-per-request", "16"])
        build_pipeline(make_environment(cfg), cfg).wait()
    out = read_topic(kafka_bootstrap, t_out, min_count=n, timeout_s=60, quiet_s=2)
    assert read_topic(kafka_bootstrap, f"{t_out}.dlq", timeout_s=5, quiet_s=1) == []
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in out}
    assert len(out) == n and sorted(docs) == sorted(f"t{i}" for i in range(n))
    for i in range(n):
        _same(docs[f"t{i}"], local[i])
    assert proxy.counts[(INFER, "rate_limited")] > 0
    assert proxy.counts[(INFER, "forwarded")] >= math.ceil(n / 16)


def test_a_restarted_worker_with_a_call_log_sends_the_server_only_the_rows_it_has_not_answered(
        run_handler, v2_server, embeddings, local, kafka_bootstrap):
    log = CallLogConfig(topic="v2-calls-it", bootstrap_servers=kafka_bootstrap)
    with FaultProxy(v2_server[0]) as proxy:
        handler = V2PredictorHandler(url=proxy.url, model="intent_head", rows_per_request=16, call_log=log)
        first, _ = run_handler(handler, embeddings[:100], batch=100)
        assert proxy.requests(INFER) == math.ceil(100 / 16)
        again, session = run_handler(handler, embeddings[:120], batch=120)  # a new worker: a restart
        assert proxy.requests(INFER) == math.ceil(100 / 16) + math.ceil(20 / 16), "only the 20 new rows"
        assert session.stats.requests == math.ceil(20 / 16)
    for got, want in zip(again, local[:120], strict=True):
        _same(got, want)
    for got, was in zip(again[:100], first, strict=True):
        np.testing.assert_array_equal(got["probabilities"], was["probabilities"])
