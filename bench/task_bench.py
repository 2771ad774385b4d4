"""Tasks and field mapping beside the sentiment job, side by side in one run (issue 21).

Not a test. One Kafka broker; two input topics hold the same 12,808 Rotten Tomatoes reviews, as
``{"id", "text"}`` and as ``{"review_id", "body", "lang"}``. Each case runs
``jobs/review_sentiment.py --mode batch`` (a MiniCluster in its own process, exactly-once sink)
over one of them into an output topic stamped by the broker (``LogAppendTime``); throughput is
records / (last stamp - first stamp), so the job's start-up is not in it. Cases, interleaved
round by round (``--repeats`` rounds, the median reported):

* ``sentiment``: the packaged job on ``{"id", "text"}``;
* ``sentiment, mapped``: the same model on the other topic with ``--text-field /body --id-field
  /review_id --keep-fields /lang``;
* ``classify (157 intents)``: ``--classifier`` with the directory of ``aisp model
  intent-classifier`` (the same MiniLM encoder, a 157-way head) on ``{"id", "text"}``.

Beside them, the decoder alone (``decode_review``, best of 7 passes over the same records) plain
and mapped, in microseconds per record. Run (about 6 min on 2 cores)::

    .venv/bin/python bench/task_bench.py [--repeats 2] [--limit N]

It writes ``## Tasks and field mapping`` into ``bench/REPORT.md`` (other sections kept) and the raw
numbers into ``bench/task_results.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _kafka_load import bench_broker, collect_stamps, create_stamped_topics
from _markdown import replace_section
from _report import machine

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import FieldMapping, KafkaCoordinates, decode_review, ingest_records
from pyflink_aisp.models import build_intent_classifier, ensure_model_assets

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "review_sentiment.py"
SECTION = "## Tasks and field mapping"
MAPPING = ("--text-field", "/body", "--id-field", "/review_id", "--keep-fields", "/lang")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="rounds of the three jobs")
    p.add_argument("--limit", type=int, default=None, help="first N reviews only")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench", help="where the report goes")
    p.add_argument("--report-only", action="store_true", help="rewrite the section from task_results.json")
    return p.parse_args(argv)


def run_job(bootstrap: str, topic: str, out: str, want: int, flags: tuple[str, ...]) -> dict[str, Any]:
    """One batch run; records/s between the first and the last output stamp."""
    create_stamped_topics(bootstrap, [out, f"{out}.dlq"])
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(JOB), "--mode", "batch", "--bootstrap-servers", bootstrap,
                           "--input-topic", topic, "--output-topic", out, *flags],
                          capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{out}: job failed\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    stamps = collect_stamps(bootstrap, out, want=want, timeout_s=120)
    span_s = (max(stamps.values()) - min(stamps.values())) / 1000
    return {"records": len(stamps), "span_s": span_s, "records_per_s": len(stamps) / span_s, "wall_s": wall}


def decode_us(values: list[bytes], mapping: FieldMapping) -> float:
    """Best of 7 passes of ``decode_review`` over ``values``, microseconds per record."""
    source = KafkaCoordinates(topic="t", partition=0, offset=0)
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for value in values:
            decode_review(value, source, mapping)
        best = min(best, time.perf_counter() - start)
    return best / len(values) * 1e6


def section(results: dict[str, Any], machine_line: str) -> str:
    """The report section."""
    rows = results["jobs"]
    base = statistics.median(r["records_per_s"] for r in rows["sentiment"])
    lines = [SECTION, "",
             "`bench/task_bench.py`: `jobs/review_sentiment.py --mode batch` (MiniCluster, exactly-once "
             f"sink) over {results['reviews']:,} real reviews, {results['repeats']} interleaved rounds, "
             "median; records/s between the first and the last output record's broker stamp "
             f"(start-up excluded); {machine_line}.", "",
             "| case | records/s (median) | each round | vs sentiment |", "|---|---|---|---|"]
    for name, runs in rows.items():
        rate = statistics.median(r["records_per_s"] for r in runs)
        each = ", ".join(f"{r['records_per_s']:.0f}" for r in runs)
        lines.append(f"| {name} | {rate:.0f} | {each} | {rate / base:.2f}x |")
    spread = max(max(r["records_per_s"] for r in runs) / min(r["records_per_s"] for r in runs)
                 for runs in rows.values())
    lines += ["", f"Rounds of one case differ by up to {spread - 1:.0%} here (a shared machine): job-level "
              "ratios inside that band are not a difference; the decoder line below is the mapping's "
              "own cost."]
    plain, mapped = results["decode_us"]["plain"], results["decode_us"]["mapped"]
    per_record_us = 1e6 / base
    lines += ["", f"Decoder alone (`decode_review`, best of 7 passes): {plain:.2f} us per record plain, "
              f"{mapped:.2f} us mapped (`/body`, `/review_id`, kept `/lang`): +{mapped - plain:.2f} us, "
              f"{(mapped - plain) / per_record_us:.2%} of the sentiment job's {per_record_us:.0f} us per "
              "record. Raw numbers: `task_results.json`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the cases and write the report."""
    args = parse_args(argv)
    if args.report_only:
        results = json.loads((args.out_dir / "task_results.json").read_text())
        replace_section(args.out_dir / "REPORT.md", SECTION, section(results, results["machine"]))
        return 0
    machine_line = machine()
    reviews = load_rotten_tomatoes()[: args.limit]
    assets = ensure_model_assets()
    plain = [{"id": r.id, "text": r.text} for r in reviews]
    mapped = [{"review_id": r.id, "body": r.text, "lang": "en"} for r in reviews]
    values = [json.dumps(d).encode() for d in mapped]
    decode = {"plain": decode_us([json.dumps(d).encode() for d in plain], FieldMapping()),
              "mapped": decode_us(values, FieldMapping(text="/body", id="/review_id", keep=("/lang",)))}
    with tempfile.TemporaryDirectory(prefix="aisp-task-bench-") as tmp, bench_broker() as bootstrap:
        intent = build_intent_classifier(Path(tmp) / "intent")
        create_stamped_topics(bootstrap, ["plain", "mapped"])
        for topic, records in (("plain", plain), ("mapped", mapped)):
            assert ingest_records(bootstrap, topic, records, progress=False).delivered == len(records)
        model = ("--model-dir", str(assets.directory))
        cases = {"sentiment": ("plain", model), "sentiment, mapped": ("mapped", (*model, *MAPPING)),
                 "classify (157 intents)": ("plain", ("--classifier", str(intent)))}
        jobs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
        for round_ in range(args.repeats):
            for i, (name, (topic, flags)) in enumerate(cases.items()):
                result = run_job(bootstrap, topic, f"out-{round_}-{i}", len(reviews), flags)
                print(f"round {round_ + 1} {name}: {result['records_per_s']:.0f} records/s", flush=True)
                jobs[name].append(result)
    results = {"reviews": len(reviews), "repeats": args.repeats, "jobs": jobs, "decode_us": decode,
               "machine": machine_line}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "task_results.json").write_text(json.dumps(results, indent=2) + "\n")
    replace_section(args.out_dir / "REPORT.md", SECTION, section(results, machine_line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
