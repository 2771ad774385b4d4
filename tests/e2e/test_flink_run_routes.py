"""Issue 26, several models in one job through `flink run` on the standalone cluster: a registry's
routes (`--models FILE --route NAME`) over the sentiment model (MiniLM + logistic head, ONNX
Runtime) and the lexicon handler (jobs/examples, shipped with -pyfs), on real reviews.

* a rule router by a field of the record, BATCH and STREAMING: each record scored by its kind's
  model, equal to that model scoring it alone; in STREAMING each rule's operator a task of its own;
* a cascade, STREAMING: the sentiment model scores all, the records whose margin is below 0.4 (and
  only they) go on to the lexicon, and each output names both models with the first's confidence
  and (answer: join) its own fields.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "jobs" / "examples"
N = 120
BELOW = 0.4


@pytest.fixture(scope="module")
def lexicon_module():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import lexicon_handler
    finally:
        sys.path.pop(0)
    return lexicon_handler


@pytest.fixture(scope="module")
def routes(tmp_path_factory, lexicon_module, model_assets):
    folder = tmp_path_factory.mktemp("routes")
    train, _ = split_reviews(load_rotten_tomatoes())
    sha = lexicon_module.train_lexicon(train).save(folder / "lexicon.json")
    args = json.dumps({"path": str(folder / "lexicon.json"), "sha256": sha})
    (folder / "models.yaml").write_text(f"""
models:
  sentiment: {{task: sentiment, path: {model_assets.directory}}}
  lexicon:
    {{task: handler, class: "lexicon_handler:LexiconSentimentHandler", args: {args}, max-batch-size: 16}}
routes:
  by_kind:
    rules:
      - {{when: {{field: /meta/kind, equals: short}}, to: lexicon}}
    default: sentiment
  unsure_to_lexicon:
    cascade:
      - {{model: sentiment, confidence: margin, below: {BELOW}}}
      - {{model: lexicon}}
    answer: join
""")
    return folder / "models.yaml", lexicon_module.Lexicon.load(folder / "lexicon.json"), sha


@pytest.fixture(scope="module")
def reviews(stack):
    _, heldout = split_reviews(load_rotten_tomatoes())
    chosen = heldout[:N]
    records = [{"id": r.id, "text": r.text, "meta": {"kind": "short" if len(r.text) < 90 else "long"}}
               for r in chosen]
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, ["routes-in"])
    assert ingest_records(bootstrap, "routes-in", [*records, {"id": "no-text"}],
                          progress=False).delivered == N + 1
    return records


def _run(stack, mode: str, route: str, registry: Path, out: str, extra: tuple[str, ...] = ()):
    bootstrap = str(stack.status().bootstrap_servers)
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap, "--input-topic",
        "routes-in", "--output-topic", out, "--mode", mode, "--models", str(registry), "--route", route,
        "--job-name", f"routes-{route}", *extra)
    cmd[cmd.index("-py"):cmd.index("-py")] = ["-pyfs", str(EXAMPLES / "lexicon_handler.py")]
    if mode == "streaming":
        cmd.insert(cmd.index("run") + 1, "-d")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tasks: list[str] = []
    try:
        docs = {json.loads(m.value())["id"]: json.loads(m.value())
                for m in read_topic(bootstrap, out, min_count=N, timeout_s=180, quiet_s=3)}
        letters = [json.loads(m.value()) for m in read_topic(bootstrap, f"{out}.dlq", min_count=1,
                                                              timeout_s=60)]
        if mode == "streaming":
            job = proc.stdout.split("JobID ")[-1].split()[0]
            rest = str(stack.status().rest_url).rstrip("/")
            tasks = [v["name"] for v in httpx.get(f"{rest}/jobs/{job}", timeout=30).json()["vertices"]]
    finally:
        if mode == "streaming":
            job = proc.stdout.split("JobID ")[-1].split()[0]
            subprocess.run([cmd[0], "cancel", job], env=stack.flink_env(), capture_output=True, timeout=120)
    return docs, letters, tasks


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_a_rule_route_scores_each_kind_with_its_model(stack, routes, reviews, model_assets, mode):
    registry, lexicon, lexicon_sha = routes
    docs, letters, tasks = _run(stack, mode, "by_kind", registry, f"routes-by-kind-{mode}",
                                ("--keep-fields", "/meta/kind", "--checkpoint-interval-ms", "1000"))
    if mode == "streaming":  # an operator per rule, each a task (thread) of its own
        python_tasks = [t for t in tasks if "PythonCalc" in t]
        assert len(python_tasks) == 2 and all(t.count("PythonCalc") == 1 for t in python_tasks), tasks
    assert sorted(docs) == sorted(r["id"] for r in reviews)  # each record once
    assert [d["reason"] for d in letters] == ["missing_text"]  # the record without a text
    model = OnnxSentimentModel(model_assets)
    scores, _ = model.predict([r["text"] for r in reviews])
    kinds = {r["meta"]["kind"] for r in reviews}
    assert kinds == {"short", "long"}
    for record, score in zip(reviews, scores, strict=True):
        doc = docs[record["id"]]
        assert doc["kind"] == record["meta"]["kind"]
        if record["meta"]["kind"] == "short":
            assert list(doc) == ["id", "kind", "label", "score", "known_words", "model_sha256", "scored_by"]
            assert doc["score"] == pytest.approx(lexicon.score(record["text"]), abs=1e-12)
            assert doc["scored_by"] == [{"model": "lexicon", "model_sha256": lexicon_sha}]
        else:
            assert list(doc) == ["id", "kind", "label", "score", "model_sha256", "scored_by"]
            assert doc["score"] == pytest.approx(float(score), abs=1e-5)
            assert doc["scored_by"] == [{"model": "sentiment", "model_sha256": model_assets.sha256}]


def test_a_cascade_sends_only_unsure_records_on(stack, routes, reviews, model_assets):
    registry, lexicon, lexicon_sha = routes
    docs, _, _ = _run(stack, "streaming", "unsure_to_lexicon", registry, "routes-cascade",
                   ("--checkpoint-interval-ms", "1000"))
    assert sorted(docs) == sorted(r["id"] for r in reviews)
    scores, _ = OnnxSentimentModel(model_assets).predict([r["text"] for r in reviews])
    escalated = 0
    for record, score in zip(reviews, scores, strict=True):
        doc = docs[record["id"]]
        margin = abs(2 * float(score) - 1)
        first = doc["scored_by"][0]
        assert first["model"] == "sentiment" and first["model_sha256"] == model_assets.sha256
        assert first["confidence"] == pytest.approx(margin, abs=2e-5)
        assert first["output"]["score"] == pytest.approx(float(score), abs=1e-5)
        if abs(margin - BELOW) < 1e-4:
            continue  # on the threshold: float noise may send it either way
        if margin < BELOW:
            escalated += 1
            assert [s["model"] for s in doc["scored_by"]] == ["sentiment", "lexicon"]
            assert doc["model_sha256"] == lexicon_sha
            assert doc["score"] == pytest.approx(lexicon.score(record["text"]), abs=1e-12)
        else:
            assert len(doc["scored_by"]) == 1 and doc["model_sha256"] == model_assets.sha256
            assert doc["score"] == pytest.approx(float(score), abs=1e-5)
    assert 0 < escalated < N
