"""Issue 13: `aisp package` + its `flink run` line on TaskManagers without the venv, parallelism 2 over
2 TaskManagers, and `aisp sql` (script and interactive) on the standalone cluster.

One stack for the module: 2 TaskManagers started Python-isolated (PATH without the venv, no PYTHONPATH,
no python.executable in config.yaml), as on a cluster that has only CPython and Flink.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from pyflink_aisp.alignment import compare_outputs
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.local import LocalStack, daemon_env, flink_overview

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

N = 300
ROOT = Path(__file__).resolve().parents[2]


def _aisp(*args: str, stack: LocalStack, **kwargs) -> subprocess.CompletedProcess[str]:
    """The `aisp` command line as the user runs it, aimed at the test's stack."""
    env = dict(os.environ, AISP_LOCAL_DIR=str(stack.state_dir))
    return subprocess.run([sys.executable, "-m", "pyflink_aisp.cli", *args], env=env, capture_output=True,
                          text=True, timeout=900, **kwargs)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stack_config, running_stack):
    config = replace(stack_config(tmp_path_factory.mktemp("deploy")), flink_taskmanagers=2,
                     flink_isolated_python=True)
    with running_stack(config) as stack:
        yield stack


@pytest.fixture(scope="module")
def reviews(stack):
    """N reviews in a 2-partition topic."""
    bootstrap = str(stack.status().bootstrap_servers)
    chosen = load_rotten_tomatoes()[:N]
    create_topics(bootstrap, ["deploy-reviews"], partitions=2)
    records = [{"id": r.id, "text": r.text} for r in chosen]
    assert ingest_records(bootstrap, "deploy-reviews", records, progress=False).delivered == N
    return chosen


@pytest.fixture(scope="module")
def expected_scores(reviews, model_assets):
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    return {r.id: float(s) for r, s in zip(reviews, scores, strict=True)}


@pytest.fixture(scope="module")
def printed_line(stack, tmp_path_factory):
    """`aisp package`'s printed `flink run` line (for input deploy-reviews, output deploy-p1) as argv."""
    out = tmp_path_factory.mktemp("package") / "review-sentiment"
    proc = _aisp("package", "--out", str(out), "--input-topic", "deploy-reviews", "--output-topic",
                 "deploy-p1", stack=stack)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    line = lines[lines.index("run it (add job flags as needed; see jobs/review_sentiment.py --help):") + 1]
    argv = shlex.split(line)
    assert argv[argv.index("-m") + 1] == f"localhost:{stack.flink_config().rest_port}"
    python = "aisp-env/venv/bin/python"
    assert argv[argv.index("-pyexec") + 1] == argv[argv.index("-pyclientexec") + 1] == python
    assert argv[argv.index("-pym") + 1] == "pyflink_aisp.jobs.review_sentiment"  # ships in the env archive
    assert "-py" not in argv and not (out / "review_sentiment.py").exists()
    manifest = json.loads((out / "package.json").read_text())
    assert manifest["files"]["model/model.onnx"] == manifest["model_sha256"]
    return argv


def _clean_env(stack: LocalStack) -> dict[str, str]:
    """The client's environment: no venv on PATH, no PYTHONPATH (as the TaskManagers)."""
    return daemon_env(replace(stack.flink_config(), isolated_python=True))


def _run_package(stack, argv, *args, cwd):
    bootstrap = str(stack.status().bootstrap_servers)
    cmd = [*argv, "--bootstrap-servers", bootstrap, "--mode", "batch", *args]
    proc = subprocess.run(cmd, env=_clean_env(stack), cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return re.search(r"JobID ([0-9a-f]{32})", proc.stdout).group(1)


def _rest(stack: LocalStack, path: str) -> dict:
    with urllib.request.urlopen(stack.flink_config().rest_url + path, timeout=10) as resp:
        return json.loads(resp.read())


def _outputs(stack, topic):
    return [bytes(m.value()) for m in read_topic(str(stack.status().bootstrap_servers), topic, min_count=N,
                                                  timeout_s=120)]


def test_taskmanagers_run_without_the_venv(stack):
    """What makes the next tests meaningful: the daemons cannot reach this venv."""
    overview = flink_overview(stack.flink_config().rest_url)
    assert overview["taskmanagers"] == 2
    venv_bin = str(Path(sys.executable).parent)
    for pid in stack.status().flink.pids:
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
        assert "PYTHONPATH" not in environ and "VIRTUAL_ENV" not in environ
        assert venv_bin not in environ["PATH"].split(os.pathsep)
    conf = yaml.safe_load((stack.flink_config().conf_dir / "config.yaml").read_text())
    assert "python.executable" not in conf


def test_the_printed_flink_run_line_scores_every_review(stack, reviews, expected_scores, printed_line,
                                                        tmp_path):
    _run_package(stack, printed_line, cwd=tmp_path)
    docs = [json.loads(v) for v in _outputs(stack, "deploy-p1")]
    assert sorted(d["id"] for d in docs) == sorted(expected_scores)
    for d in docs:
        assert d["score"] == pytest.approx(expected_scores[d["id"]], abs=1e-5)
    assert read_topic(str(stack.status().bootstrap_servers), "deploy-p1.dlq", timeout_s=5) == []


def test_parallelism_2_on_2_taskmanagers_equals_parallelism_1(stack, reviews, printed_line, tmp_path):
    argv = list(printed_line)
    argv[argv.index("deploy-p1")] = "deploy-p2"
    job_id = _run_package(stack, argv, "--parallelism", "2", cwd=tmp_path)
    report = compare_outputs(_outputs(stack, "deploy-p1"), _outputs(stack, "deploy-p2"), tolerance=1e-5)
    assert report.ok, "\n".join(report.lines())
    assert (report.count_a, report.count_b) == (N, N)  # exactly once: every id once on both sides
    # each subtask of the scoring chain ran in its own TaskManager (so its own Python worker and model)
    job = _rest(stack, f"/jobs/{job_id}")
    chain = next(v for v in job["vertices"] if v["name"].startswith("Source: KafkaSource"))
    assert chain["parallelism"] == 2 and "PythonCalc" in chain["name"]
    subtasks = _rest(stack, f"/jobs/{job_id}/vertices/{chain['id']}")["subtasks"]
    assert len({s["taskmanager-id"] for s in subtasks}) == 2
    assert all(s["metrics"]["write-records"] > 0 for s in subtasks)  # both partitions scored, one each


def _sql_script(tmp_path: Path, bootstrap: str, t_in: str, t_out: str) -> Path:
    text = (ROOT / "jobs" / "sql" / "review_sentiment.sql").read_text()
    for old, new in [
        ("'execution.runtime-mode' = 'streaming'", "'execution.runtime-mode' = 'batch'"),
        ("'scan.startup.mode' = 'group-offsets',", "'scan.startup.mode' = 'earliest-offset', "
                                                   "'scan.bounded.mode' = 'latest-offset',"),
        ("'scores-sql' ELSE 'scores-sql.dlq'", f"'{t_out}' ELSE '{t_out}.dlq'"),
        ("'topic' = 'scores-sql;scores-sql.dlq'", f"'topic' = '{t_out};{t_out}.dlq'"),
        ("'topic' = 'reviews'", f"'topic' = '{t_in}'"),
        ("127.0.0.1:9092", bootstrap),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "review_sentiment.sql"
    path.write_text(text)
    return path


def test_aisp_sql_runs_the_sql_job_file_and_prints_the_job_id(stack, reviews, expected_scores, tmp_path):
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, ["deploy-sql", "deploy-sql.dlq"])
    proc = _aisp("sql", str(_sql_script(tmp_path, bootstrap, "deploy-reviews", "deploy-sql")), stack=stack)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ids = re.findall(r"^aisp sql: submitted job ([0-9a-f]{32}) ", proc.stdout, re.M)
    assert len(ids) == 1
    docs = [json.loads(v) for v in _outputs(stack, "deploy-sql")]
    assert sorted(d["id"] for d in docs) == sorted(expected_scores)
    for d in docs:
        assert d["score"] == pytest.approx(expected_scores[d["id"]], abs=1e-5)
    # the interactive client talks to the same cluster: it lists that job
    session = _aisp("sql", stack=stack, input="SHOW JOBS;\nQUIT;\n")
    assert session.returncode == 0, session.stdout[-3000:] + session.stderr[-3000:]
    assert ids[0] in session.stdout


def test_aisp_sql_of_a_bad_statement_fails_in_one_line(stack, tmp_path):
    script = tmp_path / "bad.sql"
    script.write_text("SELECT * FROM no_such_table;\n")
    proc = _aisp("sql", str(script), stack=stack)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"aisp sql: error: {script}: Could not execute SQL statement. Reason: "
        "org.apache.calcite.sql.validate.SqlValidatorException: Object 'no_such_table' not found")
