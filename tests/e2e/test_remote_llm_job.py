"""Issue 22 through ``flink run`` on the standalone cluster: the packaged job calls llama.cpp's own
OpenAI-compatible server (SmolLM2-135M-Instruct) by options alone. BATCH: a chat model judges each
review's sentiment as a structured field from a prompt over two of its fields (--prompt-fields), each
record once, answers equal the server's own;
STREAMING: embeddings of the same reviews, equal to the server's own."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics, ingest_records

pytestmark = pytest.mark.e2e
N = 40
#: Records the chat model judges (a 135M model generates ~10-20 tokens/s beside the cluster here)
JUDGED = 16
TEMPLATE = "Is this movie review (in {lang}) positive or negative?\nReview: {text}"
SCHEMA = {"type": "object", "properties": {"sentiment": {"type": "string", "enum": ["positive", "negative"]}},
          "required": ["sentiment"]}


@pytest.fixture(scope="module")
def reviews(stack):
    """Topics ``llm-reviews``: N reviews shaped ``{review_id, body, lang}`` and one without a body;
    ``llm-judge``: the first JUDGED of them, the one without a body and one without a lang."""
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, ["llm-reviews", "llm-judge"])
    rows = load_rotten_tomatoes()[200:200 + N]
    records = [{"review_id": f"r{i}", "body": r.text, "lang": "en"} for i, r in enumerate(rows)]
    empty = {"review_id": "empty", "lang": "en"}
    no_lang = {"review_id": "no-lang", "body": rows[0].text}
    assert ingest_records(bootstrap, "llm-reviews", [*records, empty], progress=False).delivered == N + 1
    assert ingest_records(bootstrap, "llm-judge", [*records[:JUDGED], empty, no_lang],
                          progress=False).delivered == JUDGED + 2
    return {f"r{i}": r.text for i, r in enumerate(rows)}


def _topics(stack, name):
    create_topics(str(stack.status().bootstrap_servers), [name, f"{name}.dlq"])
    return name


def test_a_chat_model_judges_each_record_once_as_a_structured_field(stack, reviews, openai_server,
                                                                     job_outputs):
    """Every record once: scored with its sentiment parsed from the completion of a prompt holding its
    text and its lang field, or (a completion the small model did not finish as JSON of the schema) an
    invalid_model_output dead letter; a record without the lang field is a missing_text dead letter."""
    out_topic = _topics(stack, "llm-judged")
    stdout, read = job_outputs(stack, "batch", (
        "--bootstrap-servers", str(stack.status().bootstrap_servers), "--input-topic", "llm-judge",
        "--output-topic", out_topic, "--text-field", "/body", "--id-field", "/review_id",
        "--keep-fields", "/lang", "--prompt-fields", "/lang",
        "--remote-url", openai_server, "--remote-api", "openai-chat", "--remote-model", "smollm2",
        "--prompt-template", TEMPLATE, "--json-schema", json.dumps(SCHEMA), "--max-tokens", "48",
        "--remote-request-timeout-s", "60", "--remote-deadline-s", "120"),
        {out_topic: 1, f"{out_topic}.dlq": 1})  # a finished batch job: all of it is in the topics
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in read[out_topic]}
    letters = [json.loads(m.value()) for m in read[f"{out_topic}.dlq"]]
    invalid = [x for x in letters if x["reason"] == "invalid_model_output"]
    assert sorted((x["reason"], x["detail"]) for x in letters if x not in invalid) == [
        ("missing_text", "no value at /body; the object's fields: 'lang', 'review_id'"),
        ("missing_text", "no value at /lang; the object's fields: 'body', 'review_id' (a --prompt-fields "
                         "field)")]
    judged = [f"r{i}" for i in range(JUDGED)]
    assert sorted([*docs, *(x["id"] for x in invalid)]) == sorted(judged)  # each record once
    assert len(read[out_topic]) == len(docs) >= JUDGED - 3
    assert all(x["detail"].startswith("the completion") for x in invalid), invalid
    assert f": {JUDGED + 2} in, {len(docs)} out, {len(letters)} dead letters" in stdout
    for doc in docs.values():
        assert list(doc) == ["id", "lang", "completion", "finish_reason", "prompt_tokens",
                             "completion_tokens", "sentiment", "model_sha256"]
        assert doc["model_sha256"] == "openai:smollm2" and doc["lang"] == "en"
        assert json.loads(doc["completion"])["sentiment"] == doc["sentiment"] in ("positive", "negative")
        assert doc["prompt_tokens"] > 20 and 0 < doc["completion_tokens"] <= 48
    def prompt(rid):
        return TEMPLATE.replace("{lang}", "en").replace("{text}", reviews[rid])

    for rid in sorted(docs)[:3]:  # the server's own answer to the same request
        body = {"model": "smollm2", "max_tokens": 48, "temperature": 0.0,
                "messages": [{"role": "user", "content": prompt(rid)}],
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "output", "schema": SCHEMA, "strict": True}}}
        want = httpx.post(f"{openai_server}/v1/chat/completions", json=body, timeout=120).json()
        assert docs[rid]["completion"] == want["choices"][0]["message"]["content"]
        assert docs[rid]["prompt_tokens"] == want["usage"]["prompt_tokens"]


def test_embeddings_from_the_server_score_the_stream(stack, reviews, openai_embedding_server, job_outputs):
    out_topic = _topics(stack, "llm-embedded")
    _, read = job_outputs(stack, "streaming", (
        "--bootstrap-servers", str(stack.status().bootstrap_servers), "--input-topic", "llm-reviews",
        "--output-topic", out_topic, "--text-field", "/body", "--id-field", "/review_id",
        "--startup-mode", "earliest-offset", "--checkpoint-interval-ms", "1000",
        "--remote-url", openai_embedding_server, "--remote-api", "openai-embeddings",
        "--remote-model", "smollm2-embed", "--remote-rows-per-request", "8",
        "--remote-request-timeout-s", "60", "--remote-deadline-s", "120"),
        {out_topic: N, f"{out_topic}.dlq": 1})
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in read[out_topic]}
    assert sorted(docs) == sorted(reviews) and len(read[out_topic]) == N
    ids = sorted(reviews)
    direct = httpx.post(f"{openai_embedding_server}/v1/embeddings", timeout=120, json={
        "model": "smollm2-embed", "input": [reviews[i] for i in ids]}).json()["data"]
    want = np.array([d["embedding"] for d in sorted(direct, key=lambda d: d["index"])], dtype=np.float32)
    got = np.array([docs[i]["embedding"] for i in ids], dtype=np.float32)
    assert got.shape == (N, 576) and list(docs[ids[0]]) == ["id", "embedding", "model_sha256"]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_a_token_budget_holds_through_flink_run(stack, reviews, openai_embedding_server, job_outputs):
    """Issue 22, fixed limits: --remote-max-tokens-per-min given to the packaged job reaches the worker.
    Its budget is a minute's worth ahead: a request starts only once the tokens of the answers before it
    are paid off to within a minute, so with one request in flight the k-th request's arrival at the
    server's door (a counting proxy) is at least (tokens answered before it) * 60 / limit - 60 s after the
    first. The limit is 70 % of the topic's tokens, which the server counts per review here."""
    from pyflink_aisp.chaos import FaultProxy

    ids = sorted(reviews)
    tokens = {}
    for rid in ids:  # the server's own count: each review alone
        answer = httpx.post(f"{openai_embedding_server}/v1/embeddings", timeout=120, json={
            "model": "smollm2-embed", "input": [reviews[rid]]}).json()
        tokens[rid] = answer["usage"]["total_tokens"]
    total = sum(tokens.values())
    limit = round(0.7 * total)
    rows = 4
    out_topic = _topics(stack, "llm-token-budget")
    with FaultProxy(openai_embedding_server) as proxy:
        stdout, read = job_outputs(stack, "batch", (
            "--bootstrap-servers", str(stack.status().bootstrap_servers), "--input-topic", "llm-reviews",
            "--output-topic", out_topic, "--text-field", "/body", "--id-field", "/review_id",
            "--remote-url", proxy.url, "--remote-api", "openai-embeddings", "--remote-model", "smollm2-embed",
            "--remote-rows-per-request", str(rows), "--remote-max-concurrency", "1",
            "--remote-max-tokens-per-min", str(limit),
            "--remote-request-timeout-s", "60", "--remote-deadline-s", "300"),
            {out_topic: N, f"{out_topic}.dlq": 1})
        arrivals = np.asarray(proxy.arrivals["/v1/embeddings"])
    assert f": {N + 1} in, {N} out, 1 dead letters" in stdout
    docs = [json.loads(m.value()) for m in read[out_topic]]
    assert sorted(d["id"] for d in docs) == ids and all(len(d["embedding"]) == 576 for d in docs)
    assert len(arrivals) >= N // rows
    # with one request in flight, the answers before the last request hold all tokens but its own
    # (at most `rows` reviews' worth); 1 s of slack for the network between the worker and the proxy
    last_request = sum(sorted(tokens.values())[-rows:])
    bound = (total - last_request) * 60.0 / limit - 60.0
    assert bound > 8.0, (total, limit, last_request)  # the test means something
    assert arrivals[-1] - arrivals[0] >= bound - 1.0, (arrivals - arrivals[0], bound)
