"""Job identity: one live job per name on a cluster (against a real HTTP server on loopback)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from pyflink_aisp.errors import ConfigError, EnvironmentSetupError
from pyflink_aisp.pipeline._identity import check_no_live_job, live_jobs_named

JOBS = [
    {"jid": "a" * 32, "name": "nightly", "state": "FINISHED"},
    {"jid": "b" * 32, "name": "nightly", "state": "RESTARTING"},
    {"jid": "c" * 32, "name": "other", "state": "RUNNING"},
    {"jid": "d" * 32, "name": "old", "state": "CANCELED"},
]


@pytest.fixture
def rest() -> Iterator[str]:
    """A stand-in for the JobManager's REST API: GET /jobs/overview."""
    class Overview(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"jobs": JOBS}).encode()
            self.send_response(200 if self.path == "/jobs/overview" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Overview)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_only_live_jobs_of_that_name_count(rest: str) -> None:
    assert live_jobs_named(f"http://{rest}", "nightly") == [("b" * 32, "RESTARTING")]
    assert live_jobs_named(f"http://{rest}/", "other") == [("c" * 32, "RUNNING")]
    assert live_jobs_named(f"http://{rest}", "old") == []


def test_a_second_live_job_of_a_name_is_refused_on_a_remote_cluster(rest: str) -> None:
    host, port = rest.split(":")
    config = {"execution.target": "remote", "rest.address": host, "rest.port": port}
    with pytest.raises(ConfigError) as exc:
        check_no_live_job("nightly", config)
    job = "b" * 32
    assert str(exc.value) == (f"a job named 'nightly' is already RESTARTING on the cluster at http://{rest} "
                              f"(job {job}): stop it (`flink stop {job}`) or pass another --job-name")
    check_no_live_job("old", config)
    check_no_live_job("nightly", {**config, "execution.target": "local"})  # a MiniCluster starts empty


def test_an_unreachable_rest_api_is_one_clear_error() -> None:
    config = {"execution.target": "remote", "rest.address": "127.0.0.1", "rest.port": "1"}
    expected = r"the Flink REST API at http://127\.0\.0\.1:1/jobs/overview did not answer .*cluster up\?"
    with pytest.raises(EnvironmentSetupError, match=expected):
        check_no_live_job("x", config)
