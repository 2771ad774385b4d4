"""A numeric model on a V2 server: several records per request against one per record, side by side
in one run (issue 22).

Not a test. One Kafka broker, one KServe ModelServer (``tests/servers/kserve_onnx.py``, the venv
of ``make servers``) serving the intent head (a 157-way logistic regression on 384-d embeddings)
over the Open Inference Protocol v2 REST, behind :class:`pyflink_aisp.chaos.FaultProxy` with no
faults (it counts the requests at the server's door). The topic holds MiniLM embeddings of real
reviews. Each case runs ``jobs/review_sentiment.py --mode batch --feature-fields /embedding``
(a MiniCluster in its own process, exactly-once sink); throughput is records / (last output stamp -
first), start-up excluded. Cases, interleaved round by round (median reported):

* ``in process``: ``--predictor`` on the same ``.onnx`` (no server);
* ``remote, 1 row per request``: ``--remote-rows-per-request 1``, one request per record (the shape
  of Flink's ``ML_PREDICT``, which sends each row alone);
* ``remote, 16 / 64 rows per request``.

Server, proxy, broker and job share the machine's cores. Run (about 5 min on 2 cores)::

    .venv/bin/python bench/remote_bench.py [--repeats 2] [--records 3000]

It writes ``## Remote models`` into ``bench/REPORT.md`` and the raw numbers into
``bench/remote_results.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _kafka_load import bench_broker, create_stamped_topics
from _markdown import replace_section
from _report import machine
from task_bench import run_job

from pyflink_aisp.chaos import FaultProxy
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxEncoderHandler, Pooling
from pyflink_aisp.kafka import ingest_records
from pyflink_aisp.models import build_intent_head, build_minilm_encoder

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Remote models"
INFER = "/v2/models/intent_head/infer"
sys.path.insert(0, str(ROOT / "tests" / "servers"))
import launch  # noqa: E402  (tests/servers: the KServe server's launcher)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="rounds of the cases")
    p.add_argument("--records", type=int, default=3000, help="records in the topic (reviews, cycled)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench", help="where the report goes")
    p.add_argument("--report-only", action="store_true", help="rewrite the section from remote_results.json")
    return p.parse_args(argv)


def section(results: dict[str, Any]) -> str:
    """The report section."""
    rows = results["jobs"]
    base = statistics.median(r["records_per_s"] for r in rows["remote, 1 row per request"])
    lines = [SECTION, "",
             "`bench/remote_bench.py`: `jobs/review_sentiment.py --mode batch --feature-fields /embedding` "
             f"over {results['records']:,} MiniLM embeddings of real reviews, the intent head (157-way "
             "logistic regression) served by a KServe ModelServer over V2 REST behind a counting proxy, "
             f"{results['repeats']} interleaved rounds, median; records/s between the first and the last "
             "output's broker stamp; server, broker and job share the machine; "
             f"{results['machine']}.", "",
             "| case | records/s (median) | each round | requests per record | vs 1 row per request |",
             "|---|---|---|---|---|"]
    for name, runs in rows.items():
        rate = statistics.median(r["records_per_s"] for r in runs)
        each = ", ".join(f"{r['records_per_s']:.0f}" for r in runs)
        per = runs[0].get("requests_per_record")
        lines.append(f"| {name} | {rate:.0f} | {each} | {'-' if per is None else f'{per:.3f}'} | "
                     f"{rate / base:.2f}x |")
    lines += ["", "One row per request is the shape of Flink's `ML_PREDICT` (it sends each row alone); "
              "the comparison with `ML_PREDICT` itself (flink-model-triton) is not run yet. Raw numbers: "
              "`remote_results.json`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the cases and write the report."""
    args = parse_args(argv)
    if args.report_only:
        results = json.loads((args.out_dir / "remote_results.json").read_text())
        replace_section(args.out_dir / "REPORT.md", SECTION, section(results))
        return 0
    reviews = load_rotten_tomatoes()
    with tempfile.TemporaryDirectory(prefix="aisp-remote-bench-") as tmp, bench_broker() as bootstrap:
        folder = Path(tmp)
        build_minilm_encoder(folder / "minilm")
        head = build_intent_head(folder / "intent-head.onnx")
        encoder = OnnxEncoderHandler(model_path=folder / "minilm" / "model.onnx",
                                     tokenizer_path=folder / "minilm" / "tokenizer.json",
                                     pooling=Pooling.NONE)
        texts = [reviews[i % len(reviews)].text for i in range(args.records)]
        vectors = np.stack(encoder.run_inference(texts, encoder.load_model()))
        records = [{"tx": f"t{i}", "embedding": v.tolist()} for i, v in enumerate(vectors)]
        create_stamped_topics(bootstrap, ["features"])
        assert ingest_records(bootstrap, "features", records, progress=False).delivered == len(records)
        server = launch.kserve_server({"intent_head": head}, folder / "kserve.log")
        with server as url, FaultProxy(url) as proxy:
            common = ("--feature-fields", "/embedding", "--id-field", "/tx")
            cases: dict[str, tuple[str, ...]] = {
                "in process": ("--predictor", str(head)),
                "remote, 1 row per request": ("--remote-rows-per-request", "1"),
                "remote, 16 rows per request": ("--remote-rows-per-request", "16"),
                "remote, 64 rows per request": ("--remote-rows-per-request", "64")}
            jobs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
            for round_ in range(args.repeats):
                for i, (name, flags) in enumerate(cases.items()):
                    remote = () if name == "in process" else ("--remote-url", proxy.url, "--remote-model",
                                                               "intent_head")
                    before = proxy.requests(INFER)
                    result = run_job(bootstrap, "features", f"out-{round_}-{i}", len(records),
                                     (*common, *remote, *flags))
                    if remote:
                        result["requests_per_record"] = (proxy.requests(INFER) - before) / len(records)
                    print(f"round {round_ + 1} {name}: {result['records_per_s']:.0f} records/s", flush=True)
                    jobs[name].append(result)
    results = {"records": len(records), "repeats": args.repeats, "jobs": jobs, "machine": machine()}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "remote_results.json").write_text(json.dumps(results, indent=2) + "\n")
    replace_section(args.out_dir / "REPORT.md", SECTION, section(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
