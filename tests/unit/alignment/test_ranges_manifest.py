"""Range bounds, manifests and checkpoint positions without services (a loopback HTTP stub plays
Flink's REST API)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pyflink_aisp.alignment import (
    BoundKind,
    OutputSummary,
    PartitionRange,
    RunManifest,
    TopicRange,
    checkpoint_offsets,
    multiset_digest,
    parse_bound,
)
from pyflink_aisp.errors import ConfigError


@pytest.mark.parametrize(("text", "kind", "detail"), [
    ("earliest", BoundKind.EARLIEST, None),
    (" LATEST ", BoundKind.LATEST, None),
    ("timestamp:1700000000000", BoundKind.TIMESTAMP, 1_700_000_000_000),
    ("timestamp:2023-11-14T22:13:20Z", BoundKind.TIMESTAMP, 1_700_000_000_000),
    ("timestamp:2023-11-14T23:13:20+01:00", BoundKind.TIMESTAMP, 1_700_000_000_000),
    ("offsets:1=7, 0=3", BoundKind.OFFSETS, ((0, 3), (1, 7))),
    ("group:my-group", BoundKind.GROUP, "my-group"),
    ("checkpoint:aisp-in-out", BoundKind.CHECKPOINT, "aisp-in-out"),
    ("manifest:/tmp/x.json", BoundKind.MANIFEST, "/tmp/x.json"),
])
def test_bounds_parse(text, kind, detail):
    bound = parse_bound(text)
    assert bound.kind is kind
    if kind is BoundKind.TIMESTAMP:
        assert bound.timestamp_ms == detail
    elif kind is BoundKind.OFFSETS:
        assert bound.offsets == detail
    elif detail is not None:
        assert bound.arg == detail


@pytest.mark.parametrize(("text", "message"), [
    ("newest", "expected one of earliest, latest, timestamp:…"),
    ("offsets:", "offsets needs an argument"),
    ("earliest:5", "earliest takes no argument"),
    ("offsets:0=1,0=2", "partition 0 given twice"),
    ("offsets:0=-1", "expected PARTITION=OFFSET"),
    ("offsets:a=1", "expected PARTITION=OFFSET"),
    ("timestamp:2026-11-30T12:00:00", "has no time zone"),
    ("timestamp:yesterday", "expected epoch milliseconds or ISO 8601"),
])
def test_bad_bounds_are_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_bound(text)


def test_a_range_checks_its_partitions_and_answers_membership():
    span = TopicRange.between("t", {1: 5, 0: 0}, {0: 10, 1: 5})
    assert [p.partition for p in span.partitions] == [0, 1]
    assert span.contains(0, 0) and span.contains(0, 9) and not span.contains(0, 10)
    assert not span.contains(1, 5) and not span.contains(2, 0)
    assert TopicRange.from_json(json.loads(json.dumps(span.to_json()))) == span
    with pytest.raises(ConfigError, match="start offset 6 is after end offset 5"):
        PartitionRange(partition=0, start=6, end=5)
    with pytest.raises(ConfigError, match="cover partitions"):
        TopicRange.between("t", {0: 0}, {0: 1, 1: 1})
    with pytest.raises(ConfigError, match="not a topic range"):
        TopicRange.from_json({"topic": "t"})


def _summary(values):
    return OutputSummary(input_count=len(values), output_count=len(values), dlq_count=0,
                         output_digest=multiset_digest(values), dlq_digest=multiset_digest([]),
                         duplicates=0, missing=0, model_versions=("abc",))


def test_a_manifest_round_trips_and_its_digest_ignores_order(tmp_path):
    values = [json.dumps({"id": str(i), "score": i / 7}).encode() for i in range(100)]
    a, b = _summary(values), _summary(list(reversed(values)))
    assert a.output_digest == b.output_digest and a.output_digest != _summary(values[:-1]).output_digest
    manifest = RunManifest(job_name="job", code_version="pyflink-aisp 0.1.0", mode="batch",
                           range=TopicRange.between("in", {0: 0}, {0: 100}), checkpoint_id=None,
                           model_files={"model.onnx": "0" * 64}, output_topic="out", dlq_topic="out.dlq",
                           summary=a, created_ms=1_700_000_000_000)
    path = manifest.write(tmp_path / "manifests")
    assert path.name == "job-batch-1700000000000.json"
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["counts"]["input"] == 100 and data["range"]["topic"] == "in"
    assert RunManifest.read(path) == manifest
    data["format"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="manifest format 2 is not 1"):
        RunManifest.read(path)


class _Rest:
    """Flink REST stub: /jobs/overview and /jobs/<id>/checkpoints from mutable state."""

    def __init__(self):
        self.jobs = [{"jid": "j1", "name": "stream", "state": "RUNNING"}]
        self.checkpoints = []  # successive answers for the latest completed checkpoint
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/jobs/overview":
                    body = {"jobs": outer.jobs}
                else:
                    latest = outer.checkpoints.pop(0) if len(outer.checkpoints) > 1 else outer.checkpoints[0]
                    body = {"latest": {"completed": latest}}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def rest():
    stub = _Rest()
    yield stub
    stub.server.shutdown()


def test_checkpoint_offsets_wait_for_the_commits_and_retry_when_a_checkpoint_completes(rest):
    now = [100.0]
    slept = []
    rest.checkpoints = [{"id": 7, "latest_ack_timestamp": 99_900},   # completed 0.1 s ago: wait 0.4 s
                        {"id": 8, "latest_ack_timestamp": 100_300},  # another completed meanwhile: retry
                        {"id": 8, "latest_ack_timestamp": 100_300},
                        {"id": 8, "latest_ack_timestamp": 100_300}]
    reads = iter([{0: 5}, {0: 9}])

    def sleep(s):
        slept.append(round(s, 3))
        now[0] += s

    position = checkpoint_offsets(rest.url, "stream", lambda: next(reads), clock=lambda: now[0], sleep=sleep)
    assert (position.checkpoint_id, position.offsets, position.job_id) == (8, {0: 9}, "j1")
    assert slept == [0.4, 0.4]  # 0.5 s after each completion (99.9 s, then 100.3 s)


def test_checkpoint_offsets_name_what_is_missing(rest):
    rest.checkpoints = [None]
    with pytest.raises(ConfigError, match=r"job 'stream' \(j1\) has no completed checkpoint yet"):
        checkpoint_offsets(rest.url, "stream", lambda: {})
    with pytest.raises(ConfigError, match=r"no running job named 'other' .* \(running: stream\)"):
        checkpoint_offsets(rest.url, "other", lambda: {})
