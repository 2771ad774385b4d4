"""Issue 26, a rule route through TaskManager kills: one streaming job routes short reviews (by
their length in tokens) to the sentiment model on ONNX Runtime and the others to the same weights on
PyTorch, in an operator per rule; three kill -9s of the TaskManager (with its Python workers) lose
and duplicate nothing, each record is scored by its kind's model, and a BATCH run of the same route
over the same topic writes the same values (stream == batch, per kind). Each model then scores the
whole topic alone, in a BATCH job of its own, and `aisp verify --scored-by MODEL` finds each kind of
the route's outputs, of the stream and of the batch run, equal to that model's own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyflink_aisp.chaos import FailurePlan, run_chaos
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import read_topic
from pyflink_aisp.pipeline._routes import TokenCount

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "review_sentiment.py"
RECORDS = 900
SHORT = 24  # tokens
AISP = [sys.executable, "-m", "pyflink_aisp.cli"]
KEPT = re.compile(r"kept (\d+) of (\d+) in A \(scored by (\w+)\); (\d+) of B's (\d+) records left aside")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stack_config, running_stack):
    """A stack of its own: this test kills its TaskManager."""
    with running_stack(stack_config(tmp_path_factory.mktemp("route-chaos"))) as stack:
        yield stack


def test_a_rule_route_through_taskmanager_kills_scores_each_record_once_by_its_model(
        stack, model_assets, tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(f"""
models:
  onnx_sentiment: {{task: sentiment, path: {model_assets.directory}}}
  torch_sentiment: {{task: sentiment, path: {model_assets.directory}, runtime: torch}}
routes:
  by_length:
    rules:
      - when: {{tokens-between: [0, {SHORT}], tokenizer: {model_assets.tokenizer_path}}}
        to: onnx_sentiment
    default: torch_sentiment
""")
    route = ("--models", str(registry), "--route", "by_length")
    plan = FailurePlan(records=RECORDS, taskmanager_kills=3, broker_restarts=0, checkpoint_interval_ms=1000)
    result = run_chaos(stack, plan, job_py=JOB, model_dir=None, work_dir=tmp_path, model_args=route)
    assert all(e.recovery_s is not None for e in result.events), result.events
    assert result.lost == [] and result.duplicates == 0 and result.dlq_count == 0
    assert len(result.output_counts) == RECORDS

    t_in, t_out, _ = result.topics
    bootstrap = str(stack.status().bootstrap_servers)
    stream = {d["id"]: d for d in (json.loads(m.value()) for m in read_topic(bootstrap, t_out, timeout_s=30))}
    _run_batch(stack, bootstrap, t_in, f"{t_out}-batch", route, "route-chaos-batch")
    batch = {d["id"]: d for d in (json.loads(m.value()) for m in
                                   read_topic(bootstrap, f"{t_out}-batch", min_count=RECORDS, timeout_s=60))}

    reviews = load_rotten_tomatoes()[:RECORDS]
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    count = TokenCount(model_assets.tokenizer_path)
    kinds = {"onnx_sentiment": 0, "torch_sentiment": 0}
    for review, score in zip(reviews, scores, strict=True):
        model = "onnx_sentiment" if count(review.text) <= SHORT else "torch_sentiment"
        kinds[model] += 1
        for doc in (stream[review.id], batch[review.id]):
            assert [s["model"] for s in doc["scored_by"]] == [model]
            assert doc["score"] == pytest.approx(float(score), abs=1e-5)
        assert stream[review.id]["score"] == pytest.approx(batch[review.id]["score"], abs=1e-6)
    assert min(kinds.values()) > RECORDS // 5, kinds  # both kinds well represented

    # each model alone over the same topic; each kind of the route (stream and batch) equals it
    for model, kept in kinds.items():
        alone = f"{t_out}-{model}"
        _run_batch(stack, bootstrap, t_in, alone, ("--models", str(registry), "--model", model),
                   f"route-chaos-{model}")
        for routed in (t_out, f"{t_out}-batch"):
            proc = subprocess.run([*AISP, "verify", routed, alone, "--scored-by", model,
                                   "--bootstrap-servers", bootstrap], capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            line = KEPT.search(proc.stdout)
            assert line is not None, proc.stdout
            assert line.groups() == (str(kept), str(RECORDS), model, str(RECORDS - kept), str(RECORDS)), \
                proc.stdout
            assert proc.stdout.rstrip().endswith("SAME"), proc.stdout


def _run_batch(stack, bootstrap: str, t_in: str, t_out: str, model_args: tuple[str, ...], name: str) -> None:
    """The job over all of ``t_in`` in BATCH mode on the stack's cluster, into ``t_out``."""
    cmd = stack.flink_run_command(str(JOB), "--bootstrap-servers", bootstrap, "--input-topic", t_in,
                                  "--output-topic", t_out, "--mode", "batch", *model_args, "--job-name", name)
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
