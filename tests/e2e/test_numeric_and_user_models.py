"""Issue 21, tasks by options alone through `flink run` on the standalone cluster: a numeric ONNX
model (rag-intent-classifier's logistic regression, converted by skl2onnx) on a topic of real
embeddings, by --predictor in BATCH and by a registry entry (--models/--model) in STREAMING; the
same model and a text model on a KServe server over V2 (issue 22); and a user's own handler by
--handler module:Class, shipped with -pyfs."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews
from pyflink_aisp.inference.handlers import OnnxEncoderHandler, OnnxPredictorHandler, Pooling
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.models import build_intent_head, build_minilm_encoder, locate_intent_models

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
N = 150


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("numeric")
    build_intent_head(folder / "intent-head.onnx")
    build_minilm_encoder(folder / "minilm")
    (folder / "models.yaml").write_text("models:\n  intent_head:\n    task: predict\n"
                                        "    path: intent-head.onnx\n    max-batch-size: 64\n")
    return folder


@pytest.fixture(scope="module")
def features(stack, models):
    """A topic of {"tx", "embedding": 384 floats, "source"}: MiniLM embeddings of real reviews,
    plus one vector of the wrong width and one record without the field."""
    encoder = OnnxEncoderHandler(model_path=models / "minilm" / "model.onnx",
                                 tokenizer_path=models / "minilm" / "tokenizer.json", pooling=Pooling.NONE)
    texts = [r.text for r in load_rotten_tomatoes()[:N]]
    vectors = np.stack(encoder.run_inference(texts, encoder.load_model()))
    records = [{"tx": f"x{i}", "embedding": v.tolist(), "source": "chat" if i % 2 else "mail"}
               for i, v in enumerate(vectors)]
    records += [{"tx": "short", "embedding": [0.1, 0.2]}, {"tx": "none", "source": "mail"}]
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, ["features"])
    assert ingest_records(bootstrap, "features", records, progress=False).delivered == N + 2
    return vectors


def _expected(vectors):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = joblib.load(locate_intent_models() / "LogisticRegression.joblib")
    return clf.predict_proba(vectors)


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_a_numeric_model_scores_a_feature_topic_by_options_alone(stack, models, features, job_outputs, mode):
    bootstrap = str(stack.status().bootstrap_servers)
    out_topic = f"features-{mode}"
    create_topics(bootstrap, [out_topic, f"{out_topic}.dlq"])
    model = (("--predictor", str(models / "intent-head.onnx")) if mode == "batch" else
             ("--models", str(models / "models.yaml"), "--model", "intent_head", "--checkpoint-interval-ms",
              "1000"))
    stdout, read = job_outputs(stack, mode, (
        "--bootstrap-servers", bootstrap, "--input-topic", "features", "--output-topic", out_topic, *model,
        "--feature-fields", "/embedding", "--id-field", "/tx", "--keep-fields", "/source"),
        {out_topic: N, f"{out_topic}.dlq": 2})
    if mode == "batch":
        assert f": {N + 2} in, {N} out, 2 dead letters" in stdout
    out, dlq = read[out_topic], read[f"{out_topic}.dlq"]
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in out}
    assert sorted(docs) == sorted(f"x{i}" for i in range(N)) and len(out) == N  # each once
    version = OnnxPredictorHandler(model_path=models / "intent-head.onnx").model_version()
    want = _expected(features)
    for i in range(N):
        doc = docs[f"x{i}"]
        assert list(doc) == ["id", "source", "label", "probabilities", "model_sha256"]
        assert doc["source"] == ("chat" if i % 2 else "mail") and doc["model_sha256"] == version
        np.testing.assert_allclose(doc["probabilities"], want[i], atol=1e-5)
    assert len({d["label"] for d in docs.values()}) > 5
    letters = {json.loads(m.value())["reason"]: json.loads(m.value()) for m in dlq}
    assert sorted(letters) == ["inference_error", "missing_feature"] and len(dlq) == 2
    assert letters["inference_error"]["id"] == "short"  # it decoded: its id is known
    assert "(384,) feature vector" in letters["inference_error"]["detail"]
    raw = json.loads(base64.b64decode(letters["missing_feature"]["value_base64"]))
    assert raw == {"tx": "none", "source": "mail"}  # the record without the field, kept whole
    assert letters["missing_feature"]["detail"].startswith("no value at /embedding")


@pytest.mark.parametrize(("mode", "binding"), [("batch", "rest"), ("streaming", "grpc"), ("batch", "binary")])
def test_a_numeric_model_on_a_kserve_server_scores_the_topic_by_options_alone(
        stack, features, v2_server, job_outputs, mode, binding):
    """Issue 22: the same model served by a real KServe ModelServer over the Open Inference Protocol
    v2, called by --remote-url (its REST URL, with --remote-v2-binary the tensors as raw bytes, or its
    gRPC endpoint at grpc://): the same outputs as sklearn's, several records per request."""
    rest_url, onnx_path, grpc_url = v2_server.url, v2_server.onnx_path, v2_server.grpc_url
    url = grpc_url if binding == "grpc" else rest_url
    bootstrap = str(stack.status().bootstrap_servers)
    out_topic = f"features-remote-{mode}-{binding}"
    create_topics(bootstrap, [out_topic, f"{out_topic}.dlq"])
    stdout, read = job_outputs(stack, mode, (
        "--bootstrap-servers", bootstrap, "--input-topic", "features", "--output-topic", out_topic,
        "--remote-url", url, "--remote-model", "intent_head", "--remote-rows-per-request", "16",
        "--feature-fields", "/embedding", "--id-field", "/tx", "--keep-fields", "/source",
        *(("--remote-v2-binary",) if binding == "binary" else ()),
        *(("--checkpoint-interval-ms", "1000") if mode == "streaming" else ())),
        {out_topic: N, f"{out_topic}.dlq": 2})
    if mode == "batch":
        assert f": {N + 2} in, {N} out, 2 dead letters" in stdout
    out, dlq = read[out_topic], read[f"{out_topic}.dlq"]
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in out}
    assert sorted(docs) == sorted(f"x{i}" for i in range(N)) and len(out) == N  # each once
    want = _expected(features)
    local = OnnxPredictorHandler(model_path=onnx_path)  # the same graph, in process
    labels = [p["label"] for p in local.run_inference(list(features), local.load_model())]
    for i in range(N):
        doc = docs[f"x{i}"]
        assert list(doc) == ["id", "source", "label", "probabilities", "model_sha256"]
        assert doc["model_sha256"] == "v2:intent_head" and doc["source"] == ("chat" if i % 2 else "mail")
        np.testing.assert_allclose(doc["probabilities"], want[i], atol=1e-5)
        assert doc["label"] == labels[i]
    assert sorted(json.loads(m.value())["reason"] for m in dlq) == ["inference_error", "missing_feature"]


def test_a_fixed_request_rate_holds_through_flink_run(stack, features, v2_server, job_outputs):
    """Issue 22, fixed limits: --remote-max-requests-per-s given to the packaged job reaches the
    worker, whose request starts the server's door (a counting proxy) sees spaced by 1 / rate, with
    every record scored once as sklearn scores it."""
    from pyflink_aisp.chaos import FaultProxy

    bootstrap = str(stack.status().bootstrap_servers)
    out_topic = "features-remote-rate"
    create_topics(bootstrap, [out_topic, f"{out_topic}.dlq"])
    rate = 20.0
    with FaultProxy(v2_server.url) as proxy:
        stdout, read = job_outputs(stack, "batch", (
            "--bootstrap-servers", bootstrap, "--input-topic", "features", "--output-topic", out_topic,
            "--remote-url", proxy.url, "--remote-model", "intent_head", "--remote-rows-per-request", "2",
            "--remote-max-requests-per-s", str(rate), "--remote-max-concurrency", "8",
            "--feature-fields", "/embedding", "--id-field", "/tx"), {out_topic: N, f"{out_topic}.dlq": 2})
        arrivals = list(proxy.arrivals["/v2/models/intent_head/infer"])
    assert f": {N + 2} in, {N} out, 2 dead letters" in stdout
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in read[out_topic]}
    assert sorted(docs) == sorted(f"x{i}" for i in range(N)) and len(read[out_topic]) == N
    want = _expected(features)
    for i in range(N):
        np.testing.assert_allclose(docs[f"x{i}"]["probabilities"], want[i], atol=1e-5)
    # the limiter's bound: any interval of T seconds sees at most rate * T + 1 starts, so k + 1 arrivals
    # span at least (k - 1) / rate (less 10 ms of the network's slack between a start and its arrival)
    t = np.asarray(arrivals)
    assert len(t) >= N // 2
    for k in range(2, 11):
        spans = t[k:] - t[:-k]
        assert spans.min() >= (k - 1) / rate - 0.01, (k, sorted(spans)[:3])
    assert t[-1] - t[0] >= (len(t) - 2) / rate - 0.01


def test_a_text_model_on_a_kserve_server_scores_the_reviews_over_grpc(stack, v2_server, job_outputs):
    """Issue 22, text models over V2: without --feature-fields the job sends each record's text as a
    BYTES tensor, here over the gRPC binding, to a model that owns its tokenizer (the server's
    ``review_tfidf``); the outputs are the same graph's in process, a record without text a dead letter."""
    import onnxruntime as ort

    bootstrap = str(stack.status().bootstrap_servers)
    _, heldout = split_reviews(load_rotten_tomatoes())
    reviews = heldout[:N]
    t_in, t_out = "reviews-v2-text", "reviews-v2-text-out"
    create_topics(bootstrap, [t_in, t_out, f"{t_out}.dlq"])
    records = [{"id": r.id, "text": r.text} for r in reviews] + [{"id": "no-text", "body": "elsewhere"}]
    assert ingest_records(bootstrap, t_in, records, progress=False).delivered == N + 1
    stdout, read = job_outputs(stack, "batch", (
        "--bootstrap-servers", bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--remote-url", v2_server.grpc_url, "--remote-model", "review_tfidf",
        "--remote-rows-per-request", "16",
        "--id-field", "/id"), {t_out: N, f"{t_out}.dlq": 1})
    assert f": {N + 1} in, {N} out, 1 dead letters" in stdout
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in read[t_out]}
    assert sorted(docs) == sorted(r.id for r in reviews) and len(read[t_out]) == N
    session = ort.InferenceSession(str(v2_server.text_onnx_path), providers=["CPUExecutionProvider"])
    labels, probabilities = session.run(None, {"text": np.array([r.text for r in reviews], dtype=object)
                                               .reshape(-1, 1)})
    for i, r in enumerate(reviews):
        doc = docs[r.id]
        assert list(doc) == ["id", "label", "probabilities", "model_sha256"]
        assert doc["label"] == labels[i] and doc["model_sha256"] == "v2:review_tfidf"
        np.testing.assert_allclose(doc["probabilities"], probabilities[i], atol=1e-6)
    [letter] = [json.loads(m.value()) for m in read[f"{t_out}.dlq"]]
    assert letter["reason"] == "missing_text"
    assert json.loads(base64.b64decode(letter["value_base64"])) == {"id": "no-text", "body": "elsewhere"}


def test_a_users_handler_runs_by_option_shipped_with_pyfs(stack, tmp_path):
    """--handler lexicon_handler:LexiconSentimentHandler (jobs/examples, shipped with -pyfs) and its
    --handler-args: the job writes the fields its task declares, scored as the handler scores."""
    sys.path.insert(0, str(ROOT / "jobs" / "examples"))
    try:
        import lexicon_handler
    finally:
        sys.path.pop(0)
    train, _ = split_reviews(load_rotten_tomatoes())
    lexicon = lexicon_handler.train_lexicon(train)
    path = tmp_path / "lexicon.json"
    lexicon.save(path)
    sha = sha256_file(path)
    reviews = load_rotten_tomatoes()[-80:]
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, ["lexicon-in", "lexicon-out", "lexicon-out.dlq"])
    assert ingest_records(bootstrap, "lexicon-in", [{"id": r.id, "text": r.text} for r in reviews],
                          progress=False).delivered == len(reviews)
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap, "--input-topic",
        "lexicon-in", "--output-topic", "lexicon-out", "--mode", "batch",
        "--handler", "lexicon_handler:LexiconSentimentHandler",
        "--handler-args", json.dumps({"path": str(path), "sha256": sha}))
    cmd[cmd.index("-py"):cmd.index("-py")] = ["-pyfs", str(ROOT / "jobs" / "examples" / "lexicon_handler.py")]
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    docs = {json.loads(m.value())["id"]: json.loads(m.value())
            for m in read_topic(bootstrap, "lexicon-out", min_count=len(reviews), timeout_s=60)}
    assert sorted(docs) == sorted(r.id for r in reviews)
    for r in reviews:
        doc = docs[r.id]
        assert list(doc) == ["id", "label", "score", "known_words", "model_sha256"]
        assert doc["score"] == pytest.approx(lexicon.score(r.text), abs=1e-9)
        assert doc["known_words"] == lexicon.known_words(r.text) and doc["model_sha256"] == sha


def test_a_rerun_with_a_call_log_asks_the_server_nothing_it_answered_before(stack, features, v2_server,
                                                                            job_outputs):
    """Issue 22, replay-safe V2 calls through flink run: the packaged batch job run twice over the same
    topic with --remote-call-log (a compacted topic on the job's brokers). The first run's infer requests
    at the server's door (a counting proxy) carry every row, several to a request; the second run, a
    backfill of the same records, sends none, and writes the same outputs, answered from the log."""
    from pyflink_aisp.chaos import FaultProxy

    bootstrap = str(stack.status().bootstrap_servers)
    infer = "/v2/models/intent_head/infer"
    runs = []
    with FaultProxy(v2_server.url) as proxy:
        for out_topic in ("features-logged-1", "features-logged-2"):
            create_topics(bootstrap, [out_topic, f"{out_topic}.dlq"])
            before = proxy.requests(infer)
            stdout, read = job_outputs(stack, "batch", (
                "--bootstrap-servers", bootstrap, "--input-topic", "features", "--output-topic", out_topic,
                "--remote-url", proxy.url, "--remote-model", "intent_head", "--remote-rows-per-request", "16",
                "--feature-fields", "/embedding", "--id-field", "/tx", "--remote-call-log", "features-calls"),
                {out_topic: N, f"{out_topic}.dlq": 2})
            assert f": {N + 2} in, {N} out, 2 dead letters" in stdout
            docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in read[out_topic]}
            reasons = sorted(json.loads(m.value())["reason"] for m in read[f"{out_topic}.dlq"])
            runs.append((proxy.requests(infer) - before, docs, reasons))
    (first, docs, reasons), (second, again, reasons_again) = runs
    assert first >= -(-N // 16) and second == 0, (first, second)
    assert sorted(docs) == sorted(f"x{i}" for i in range(N)) and again == docs
    assert reasons == reasons_again == ["inference_error", "missing_feature"]
    want = _expected(features)
    for i in range(N):
        np.testing.assert_allclose(again[f"x{i}"]["probabilities"], want[i], atol=1e-5)
