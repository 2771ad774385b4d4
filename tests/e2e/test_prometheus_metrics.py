"""Flink's Prometheus reporter on the local stack: the job's `aisp` metric group is scrapeable."""

import json
import re
import subprocess
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.local import find_free_port

pytestmark = pytest.mark.e2e

N = 300
ROOT = Path(__file__).resolve().parents[2]
RECORDS_IN = "flink_taskmanager_job_task_operator_aisp_recordsIn"
RECORDS_OUT = "flink_taskmanager_job_task_operator_aisp_recordsOut"


def _two_free_ports(taken: set[int]) -> int:
    """A port N such that N and N+1 are free, outside the ephemeral range (the TaskManager
    binds N+1 seconds after the stack's other daemons start) and not among ``taken``."""
    while True:
        port = find_free_port(span=2)
        if not {port, port + 1} & taken:
            return port


def _scrape(url: str) -> dict[str, list[float]]:
    """Metric name -> sample values of one Prometheus endpoint."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode("utf-8")
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample.value)
    return found


def _dashboard_metrics() -> list[str]:
    """The metric names docker/grafana/aisp-dashboard.json queries."""
    text = (ROOT / "docker" / "grafana" / "aisp-dashboard.json").read_text()
    names = sorted(set(re.findall(r"flink_taskmanager_job_task_operator_aisp_\w+", text)))
    assert len(names) >= 10 and json.loads(text)["panels"]
    return names


def _wait_for_total(url: str, name: str, total: float, deadline_s: float) -> dict[str, list[float]]:
    """Scrape until the samples of ``name`` add up to ``total`` (gauges lag a bundle); last scrape."""
    end = time.monotonic() + deadline_s
    metrics = _scrape(url)
    while sum(metrics.get(name, [])) != total and time.monotonic() < end:
        time.sleep(1.0)
        metrics = _scrape(url)
    return metrics


def _submit_stream(stack, model_assets, bootstrap: str, t_in: str, t_out: str,
                   *flags: str) -> tuple[list[str], str]:
    """`flink run -d` of the streaming job; the command and the job id."""
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap,
        "--input-topic", t_in, "--output-topic", t_out, "--model-dir", str(model_assets.directory),
        "--checkpoint-interval-ms", "1000", *flags,
    )  # fmt: skip
    cmd.insert(cmd.index("run") + 1, "-d")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cmd, re.search(r"JobID ([0-9a-f]{32})", proc.stdout).group(1)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stack_config, running_stack):
    config = stack_config(tmp_path_factory.mktemp("prom"))
    taken = {config.kafka_port, config.kafka_controller_port, config.flink_rest_port, config.flink_rpc_port}
    with running_stack(replace(config, prometheus_port=_two_free_ports(taken))) as stack:
        yield stack


def test_status_names_both_reporter_endpoints(stack):
    status = stack.status()
    port = stack.config.prometheus_port
    urls = (f"http://localhost:{port}/metrics", f"http://localhost:{port + 1}/metrics")
    assert status.prometheus_urls == urls
    assert status.lines()[-1].startswith(f"metrics: prometheus http://localhost:{port}/metrics")


def test_taskmanager_endpoint_serves_the_jobs_aisp_metrics(stack, model_assets):
    bootstrap = str(stack.status().bootstrap_servers)
    t_in, t_out = "prom-reviews", "prom-scores"
    create_topics(bootstrap, [t_in, t_out])
    reviews = load_rotten_tomatoes()[:N]
    records = [{"id": r.id, "text": r.text} for r in reviews]
    assert ingest_records(bootstrap, t_in, records, progress=False).delivered == N
    cmd, job_id = _submit_stream(stack, model_assets, bootstrap, t_in, t_out)
    try:
        assert len(read_topic(bootstrap, t_out, min_count=N, timeout_s=180, quiet_s=2)) == N
        by_url = {url: _scrape(url) for url in stack.status().prometheus_urls}
        tm_urls = [url for url, m in by_url.items() if any(k.startswith("flink_taskmanager_") for k in m)]
        jm_urls = [url for url, m in by_url.items() if any(k.startswith("flink_jobmanager_") for k in m)]
        assert len(tm_urls) == 1 and len(jm_urls) == 1 and tm_urls != jm_urls, sorted(by_url)
        metrics = _wait_for_total(tm_urls[0], RECORDS_IN, float(N), deadline_s=60)
        assert sum(metrics[RECORDS_IN]) == N
        assert sum(metrics[RECORDS_OUT]) == N
        assert not any("_aisp_" in name for name in by_url[jm_urls[0]])
        assert set(_dashboard_metrics()) <= set(metrics), set(_dashboard_metrics()) - set(metrics)
        assert metrics["flink_taskmanager_job_task_operator_aisp_modelLoadTimeMs"][0] > 0
    finally:
        subprocess.run([cmd[0], "cancel", job_id], env=stack.flink_env(), capture_output=True, timeout=120)


ALARM = "flink_taskmanager_job_task_operator_aisp_deadLetterAlarm"
DEAD_LETTERS = "flink_taskmanager_job_task_operator_aisp_deadLetters"


def test_a_stream_of_another_shape_raises_the_dead_letter_alarm_in_its_first_seconds(stack, model_assets):
    """Issue 25: {"review_id", "body"} records: the alarm gauge is 1 and the dead-letter count non-zero
    after the first 150 records (judged from the 100th, not at the end of a 1,000-record window), and the
    TaskManager log has the one warning line."""
    bootstrap = str(stack.status().bootstrap_servers)
    t_in, t_out = "prom-foreign", "prom-foreign-scores"
    create_topics(bootstrap, [t_in, t_out])
    cmd, job_id = _submit_stream(stack, model_assets, bootstrap, t_in, t_out, "--job-name", "foreign-stream")
    try:
        n = 150
        records = [{"review_id": r.id, "body": r.text} for r in load_rotten_tomatoes()[:n]]
        assert ingest_records(bootstrap, t_in, records, progress=False).delivered == n
        tm_url = _wait_for_job_metrics(stack.status().prometheus_urls)  # gauges come with the first bundle
        metrics = _wait_for_total(tm_url, DEAD_LETTERS, float(n), deadline_s=120)
        assert sum(metrics[DEAD_LETTERS]) == sum(metrics[RECORDS_IN]) == n
        assert sum(metrics[ALARM]) == 1
        logs = "\n".join(p.read_text(errors="replace")
                         for p in stack.flink_config().log_dir.glob("*taskexecutor*"))
        warnings = [line for line in logs.splitlines() if "records were dead-lettered" in line]
        assert warnings and all("as missing_text (no 'text' field; the object's fields: 'body', 'review_id')"
                                in line for line in warnings), warnings
        assert len(warnings) == 1  # one line, not one per batch
    finally:
        subprocess.run([cmd[0], "cancel", job_id], env=stack.flink_env(), capture_output=True, timeout=120)


def _wait_for_job_metrics(urls: tuple[str, ...], deadline_s: float = 120) -> str:
    """The endpoint that serves a job's aisp metrics, once one does (the operator opened)."""
    end = time.monotonic() + deadline_s
    last_error: OSError | None = None
    while True:
        for url in urls:
            try:
                names = _scrape(url)
            except OSError as exc:  # a TaskManager's reporter busy or still binding: ask again
                last_error = exc
                continue
            if any("_aisp_" in k for k in names):
                return url
        assert time.monotonic() < end, f"no aisp metrics on {urls} after {deadline_s} s ({last_error!r})"
        time.sleep(1.0)


def _labelled(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Metric name -> (labels, value) samples of one Prometheus endpoint."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode("utf-8")
    return {family.name: [(s.labels, s.value) for s in family.samples]
            for family in text_string_to_metric_families(text)}


def test_a_cascades_per_model_metrics_count_its_escalations(stack, model_assets, tmp_path):
    """Issue 26: a cascade (the sentiment model on ONNX Runtime, then the same weights on PyTorch for
    the records with a margin below 0.5) exports per-model gauges under the label model=<name>: the
    escalations equal the records whose margin (from the model scoring alone) is below 0.5, and the
    dashboard's route panels query names the reporter serves."""
    from pyflink_aisp.inference.handlers import OnnxSentimentModel

    registry = tmp_path / "models.yaml"
    registry.write_text(f"""
models:
  onnx_sentiment: {{task: sentiment, path: {model_assets.directory}}}
  torch_sentiment: {{task: sentiment, path: {model_assets.directory}, runtime: torch}}
routes:
  unsure:
    cascade: [{{model: onnx_sentiment, confidence: margin, below: 0.5}}, {{model: torch_sentiment}}]
""")
    bootstrap = str(stack.status().bootstrap_servers)
    t_in, t_out = "prom-cascade", "prom-cascade-scores"
    create_topics(bootstrap, [t_in, t_out])
    reviews = load_rotten_tomatoes()[:N]
    assert ingest_records(bootstrap, t_in, [{"id": r.id, "text": r.text} for r in reviews],
                          progress=False).delivered == N
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    unsure = sum(abs(2 * float(s) - 1) < 0.5 for s in scores)
    assert 0 < unsure < N
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap, "--input-topic", t_in,
        "--output-topic", t_out, "--models", str(registry), "--route", "unsure",
        "--checkpoint-interval-ms", "1000", "--job-name", "prom-cascade")
    cmd.insert(cmd.index("run") + 1, "-d")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job_id = re.search(r"JobID ([0-9a-f]{32})", proc.stdout).group(1)
    try:
        assert len(read_topic(bootstrap, t_out, min_count=N, timeout_s=180, quiet_s=2)) == N
        url = _wait_for_job_metrics(stack.status().prometheus_urls)
        _wait_for_total(url, RECORDS_IN, float(N), deadline_s=60)
        families = _labelled(url)
        per_model = {name: {s[0].get("model"): s[1] for s in samples}
                     for name, samples in families.items() if name.endswith(("_escalated", "_records"))}
        escalated = next(v for k, v in per_model.items() if k.endswith("_escalated"))
        answered = next(v for k, v in per_model.items() if k.endswith("_records"))
        assert escalated == {"onnx_sentiment": unsure, "torch_sentiment": 0}, per_model
        assert answered == {"onnx_sentiment": N - unsure, "torch_sentiment": unsure}, per_model
        text = (ROOT / "docker" / "grafana" / "aisp-dashboard.json").read_text()
        route_names = set(re.findall(r"flink_taskmanager_job_task_operator_model_aisp_\w+", text))
        assert route_names and route_names <= set(families), route_names - set(families)
    finally:
        subprocess.run([cmd[0], "cancel", job_id], env=stack.flink_env(), capture_output=True, timeout=120)
