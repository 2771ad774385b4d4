"""Same outputs before and after a change: the job of a baseline commit beside this one.

Not a test (it runs the whole corpus several times). On one broker it starts,
with all 12,808 reviews (or ``--reviews N``) in one input topic, it runs

- ``base``: ``jobs/review_sentiment.py`` of ``--baseline-ref`` (a git worktree, its own
  ``pyflink_aisp`` first on ``PYTHONPATH``), BATCH mode;
- ``batch``: this checkout's job, BATCH mode (default operator);
- ``streaming``: this checkout's job, STREAMING mode, stopped once every id is out;
- ``async``: this checkout's job, BATCH mode, ``--operator async``;

all with the same model assets, then compares every run with ``base``: the same
ids, each once, the same labels, scores within ``--tolerance``. Prints a table
and writes ``--out`` (JSON); exit 1 on any difference.

Run::

    .venv/bin/python bench/same_outputs.py [--baseline-ref 10945a1] [--reviews 12808]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline-ref", default="10945a1", help="git ref of the job to compare with")
    p.add_argument("--reviews", type=int, default=None, help="first N reviews (default: all)")
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest |Δscore| accepted")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "same_outputs.json")
    return p.parse_args(argv)


def _job(script: Path, args: list[str], *, pythonpath: str | None, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, AISP_HOME=str(ROOT / ".aisp"))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, str(script), *args], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=script.parent.parent, start_new_session=True)


def _outputs(bootstrap: str, topic: str, want: int) -> dict[str, tuple[str, float]]:
    from pyflink_aisp.kafka import read_topic

    docs = [json.loads(m.value()) for m in read_topic(bootstrap, topic, min_count=want, timeout_s=900,
                                                       quiet_s=10)]
    out = {d["id"]: (d["label"], float(d["score"])) for d in docs}
    if len(out) != len(docs):
        raise RuntimeError(f"{topic}: {len(docs) - len(out)} duplicate ids")
    return out


def _run(name: str, script: Path, flags: list[str], bootstrap: str, topic: str, want: int,
         logs: Path, pythonpath: str | None = None) -> dict[str, tuple[str, float]]:
    from pyflink_aisp.kafka import create_topics

    out_topic = f"same-{name}-{time.monotonic_ns()}"
    create_topics(bootstrap, [out_topic])  # a streaming job's output is read while it runs
    args = ["--bootstrap-servers", bootstrap, "--input-topic", topic, "--output-topic", out_topic,
            "--group-id", out_topic, *flags]
    print(f"[{name}] {script} {' '.join(flags)}", flush=True)
    proc = _job(script, args, pythonpath=pythonpath, log=logs / f"{name}.log")
    try:
        if "streaming" not in flags and proc.wait(timeout=1800) != 0:
            raise RuntimeError(f"{name}: job exited {proc.returncode}; log {logs / (name + '.log')}")
        return _outputs(bootstrap, out_topic, want)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=60)


def compare(base: dict[str, tuple[str, float]], other: dict[str, tuple[str, float]]) -> dict[str, Any]:
    """Ids missing / extra, label flips and the largest score difference."""
    common = base.keys() & other.keys()
    diffs = [abs(base[k][1] - other[k][1]) for k in common]
    return {"records": len(other), "missing": len(base.keys() - other.keys()),
            "extra": len(other.keys() - base.keys()),
            "label_flips": sum(base[k][0] != other[k][0] for k in common),
            "max_abs_score_diff": max(diffs, default=0.0)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from _kafka_load import bench_broker, produce_all

    from pyflink_aisp.datasets import load_rotten_tomatoes
    from pyflink_aisp.kafka import create_topics
    from pyflink_aisp.models import ensure_model_assets

    reviews = load_rotten_tomatoes()[: args.reviews]
    assets = ensure_model_assets()
    common = ["--model-dir", str(assets.directory)]
    with tempfile.TemporaryDirectory(prefix="aisp-same-") as tmp, bench_broker() as bootstrap:
        worktree, logs = Path(tmp) / "base", Path(tmp)
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "--detach", str(worktree), args.baseline_ref], check=True,
                       capture_output=True)
        try:
            topic = "same-in"
            create_topics(bootstrap, [topic])
            produce_all(bootstrap, topic, [(r.id, r.text) for r in reviews])
            n = len(reviews)
            here = ROOT / "jobs" / "review_sentiment.py"
            base_job = worktree / "jobs" / "review_sentiment.py"
            runs = {"base": _run("base", base_job, ["--mode", "batch", *common], bootstrap, topic, n, logs,
                                 pythonpath=str(worktree))}
            runs["batch"] = _run("batch", here, ["--mode", "batch", *common], bootstrap, topic, n, logs)
            runs["streaming"] = _run("streaming", here, ["--mode", "streaming", "--checkpoint-interval-ms",
                                                         "2000", *common], bootstrap, topic, n, logs)
            runs["async"] = _run("async", here, ["--mode", "batch", "--operator", "async", *common],
                                 bootstrap, topic, n, logs)
        finally:
            subprocess.run([*git, "remove", "--force", str(worktree)], check=False)
    result = {"baseline_ref": args.baseline_ref, "reviews": len(reviews), "tolerance": args.tolerance,
              "runs": {name: compare(runs["base"], out) for name, out in runs.items()}}
    ok = True
    print(f"| run | records | missing | extra | label flips | max abs Δscore vs {args.baseline_ref} "
          "| verdict |")
    for name, c in result["runs"].items():
        good = c["records"] == len(reviews) and not (c["missing"] or c["extra"] or c["label_flips"]) \
            and c["max_abs_score_diff"] <= args.tolerance
        ok = ok and good
        print(f"| {name} | {c['records']:,} | {c['missing']} | {c['extra']} | {c['label_flips']} | "
              f"{c['max_abs_score_diff']:.2e} | {'same' if good else 'DIFFERENT'} |")
    args.out.write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
