"""Remote models: several records per request against one per record, and against Flink's own
``ML_PREDICT``, side by side in one run (issue 22).

Not a test. One Kafka broker, one KServe ModelServer (``tests/servers/kserve_onnx.py``, the venv
of ``make servers``) serving the intent head (a 157-way logistic regression on 384-d embeddings)
over the Open Inference Protocol v2 REST, behind :class:`pyflink_aisp.chaos.FaultProxy` with no
faults (it counts the requests at the server's door). The topic holds MiniLM embeddings of real
reviews. Each case runs ``jobs/review_sentiment.py --mode batch --feature-fields /embedding``
(a MiniCluster in its own process, exactly-once sink); throughput is records / (last output's broker
stamp - the run's first request at the server, the proxy's clock), start-up excluded; the in-process
case has no server and is timed between its first and last output. Cases, interleaved round by round
(median reported):

* ``in process``: ``--predictor`` on the same ``.onnx`` (no server);
* ``remote, 1 row per request``: ``--remote-rows-per-request 1``, one request per record (the shape
  of Flink's ``ML_PREDICT``, which sends each row alone);
* ``remote, 16 / 64 rows per request``;
* ``remote gRPC, 16 / 64 rows per request``: the same server's gRPC binding (``grpc://``); the proxy
  speaks HTTP only, so these are compared with the direct cases below by their output span (first to
  last output's broker stamp) in a table of their own, and their requests are not counted (the same
  batcher cuts them, so as many as over REST);
* ``Flink ML_PREDICT (flink-model-triton 2.3.0)``: ``_ml_predict_job.py`` on the same server, async,
  ``--ml-predict-concurrency`` requests in flight, with the three things it needs to run at all
  (``_triton_provider.py``): the provider's two planning faults repaired in a subclass, the head
  served a second time with its tensors named in capitals (``intent_head_caps``), and the proxy
  dropping the ``/versions/latest`` segment KServe does not serve;
* straight to the server (no proxy, which is a Python process on the same cores and capped Flink's
  one request per row), by output span: ``direct REST, 16 / 64 rows per request`` (JSON
  lists), ``direct REST binary, ...`` (``--remote-v2-binary``: the tensors as raw bytes after a JSON
  header, the binary tensor data extension) and ``Flink ML_PREDICT (...), direct`` (the server itself
  answers the versioned path: ``kserve_onnx.py --any-version``), beside the gRPC cases.

Then embeddings of real reviews on an **OpenAI-compatible** server: llama.cpp's ``llama-server
--embeddings`` (SmolLM2-135M, mean pooling, one slot: ``make servers``), a fresh one per run (it keeps the
prompts it has seen) behind the proxy, each case
over ``--texts`` reviews:

* ``Flink ML_PREDICT (flink-model-openai 2.3.0)``: async, ``--ml-predict-concurrency`` requests in
  flight (Flink's default 10), one text per request;
* ``remote, 1 / 16 rows per request``: ``--remote-api openai-embeddings``.

Server, proxy, broker and job share the machine's cores. Run (the V2 part alone, ``--part v2``, took
about 20 min on 2 cores with the defaults)::

    .venv/bin/python bench/remote_bench.py [--repeats 2] [--records 20000] [--texts 300]

It writes ``## Remote models`` into ``bench/REPORT.md`` and the raw numbers into
``bench/remote_results.json``.
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

import numpy as np
from _kafka_load import bench_broker, collect_stamps, create_stamped_topics
from _markdown import replace_section
from _report import machine
from _triton_provider import capitalized_model, provider_jar, without_version
from task_bench import run_job

from pyflink_aisp.chaos import FaultProxy
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxEncoderHandler, Pooling
from pyflink_aisp.kafka import ingest_records
from pyflink_aisp.local import find_free_port
from pyflink_aisp.models import build_intent_head, build_minilm_encoder

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Remote models"
INFER = "/v2/models/intent_head/infer"
CAPS_INFER = "/v2/models/intent_head_caps/infer"
EMBED = "/v1/embeddings"
ML_PREDICT_JOB = Path(__file__).resolve().parent / "_ml_predict_job.py"
TRITON = "Flink ML_PREDICT (flink-model-triton 2.3.0)"
DIRECT = "direct"
TRITON_DIRECT = f"{TRITON}, {DIRECT}"
OPENAI = "Flink ML_PREDICT (flink-model-openai 2.3.0)"
sys.path.insert(0, str(ROOT / "tests" / "servers"))
import launch  # noqa: E402  (tests/servers: the KServe server's launcher)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="rounds of the cases")
    p.add_argument("--records", type=int, default=20000, help="records in the topic (reviews, cycled)")
    p.add_argument("--texts", type=int, default=300, help="reviews for the embedding cases")
    p.add_argument("--ml-predict-concurrency", type=int, default=10,
                   help="async ML_PREDICT's requests in flight (Flink's default 10)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench", help="where the report goes")
    p.add_argument("--part", choices=("all", "v2", "embeddings"), default="all",
                   help="run one part only, keeping the other's numbers from remote_results.json")
    p.add_argument("--report-only", action="store_true", help="rewrite the section from remote_results.json")
    return p.parse_args(argv)


def run_ml_predict(bootstrap: str, topic: str, out: str, want: int, provider: str, endpoint: str,
                   model: str, concurrency: int, jars: tuple[Path, ...] = ()) -> dict[str, Any]:
    """One ``_ml_predict_job.py`` run; records/s as :func:`task_bench.run_job` measures them, or
    ``{"error": ...}`` with the job's first ``Caused by`` line where Flink refused it."""
    create_stamped_topics(bootstrap, [out])
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ML_PREDICT_JOB), "--provider", provider, "--bootstrap-servers",
                           bootstrap, "--input-topic", topic, "--output-topic", out, "--endpoint", endpoint,
                           "--model", model, "--max-concurrent", str(concurrency),
                           *(arg for jar in jars for arg in ("--provider-jar", str(jar)))],
                          capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        causes = [line.strip() for line in proc.stderr.splitlines() if line.startswith("Caused by:")]
        return {"error": causes[-1] if causes else proc.stderr.strip().splitlines()[-1], "wall_s": wall}
    stamps = collect_stamps(bootstrap, out, want=want, timeout_s=120)
    span_s = (max(stamps.values()) - min(stamps.values())) / 1000
    return {"records": len(stamps), "span_s": span_s, "records_per_s": len(stamps) / span_s, "wall_s": wall}


def from_first_request(result: dict[str, Any], proxy: FaultProxy, since: float, path: str,
                       stamps: dict[str, int]) -> dict[str, Any]:
    """``result`` measured from the run's first request at the server to its last output's broker
    stamp (both wall clock on this machine): a job that writes its outputs in bursts (ours writes a
    model batch at once, and keeps several in flight) is not flattered by a short output span."""
    first = proxy.first_request_since(since, path)
    if first is None:
        raise RuntimeError(f"no request reached {path}")
    span_s = max(stamps.values()) / 1000 - first
    return {**result, "output_span_s": result["span_s"], "span_s": span_s,
            "records_per_s": len(stamps) / span_s}


def _table(rows: dict[str, list[dict[str, Any]]], base_name: str) -> list[str]:
    base = statistics.median(r["records_per_s"] for r in rows[base_name])
    lines = ["| case | records/s (median) | each round | requests per record | "
             f"vs {base_name.removeprefix('remote, ')} |", "|---|---|---|---|---|"]
    for name, runs in rows.items():
        if "error" in runs[0]:
            lines.append(f"| {name} | refused by Flink | - | 0 | - |")
            continue
        rate = statistics.median(r["records_per_s"] for r in runs)
        each = ", ".join(f"{r['records_per_s']:.0f}" for r in runs)
        per = runs[0].get("requests_per_record")
        lines.append(f"| {name} | {rate:.0f} | {each} | {'-' if per is None else f'{per:.3f}'} | "
                     f"{rate / base:.2f}x |")
    return lines


def _binding_table(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    """REST (JSON lists, and binary where run) against gRPC at the same rows per request, each by its
    output span (the proxy does not see gRPC); and each against Flink's ML_PREDICT by the same measure,
    where it ran."""
    sizes = [n.removeprefix("remote gRPC, ") for n in rows if n.startswith("remote gRPC, ")]
    # a run of an earlier version of the bench: REST through the proxy, Flink's ML_PREDICT too
    old = not any(n.startswith(DIRECT) for n in rows)
    rest = "remote, {}" if old else f"{DIRECT} REST, {{}}"
    sizes = [n for n in sizes if rest.format(n) in rows]
    if not sizes:
        return []

    def rate(name: str) -> float | None:
        return _span_rate(rows, name)

    flink = None if _refused(rows) else rate(TRITON if old else TRITON_DIRECT)
    kinds = [("REST", rest), ("REST binary", f"{DIRECT} REST binary, {{}}"), ("gRPC", "remote gRPC, {}")]
    kinds = [(label, pattern) for label, pattern in kinds if rate(pattern.format(sizes[0])) is not None]
    head = ["rows per request", *(f"{label} records/s" for label, _ in kinds)]
    if flink is not None:
        head += [f"{label} / ML_PREDICT" for label, _ in kinds]
    lines = ["The V2 bindings side by side, each by its output span (first to last output's broker stamp), "
             + ("REST through the proxy (it does not see gRPC)" if old else
                "each job straight to the server (no proxy: it does not see gRPC)")
             + ("" if flink is None else f", and against {TRITON} by the same measure "
                f"({flink:.0f} records/s)") + ":", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size in sizes:
        rates = [rate(pattern.format(size)) or 0.0 for _, pattern in kinds]
        cells = [size.removesuffix(" rows per request"), *(f"{r:.0f}" for r in rates)]
        if flink is not None:
            cells += [f"{r / flink:.2f}x" for r in rates]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _span_rate(rows: dict[str, list[dict[str, Any]]], name: str) -> float | None:
    """The median records/s of case ``name`` by its output span; None where it did not run."""
    runs = rows.get(name)
    if not runs:
        return None
    return statistics.median(float(r["records"] / r.get("output_span_s", r["span_s"])) for r in runs)


def _refused(rows: dict[str, list[dict[str, Any]]]) -> str | None:
    """Flink's planning error for the triton case, if it refused the model (or did not run)."""
    return rows.get(TRITON, [{"error": "not run"}])[0].get("error")


def section(results: dict[str, Any]) -> str:
    """The report section."""
    rows = results["jobs"]
    lines = [SECTION, "",
             "`bench/remote_bench.py`: `jobs/review_sentiment.py --mode batch --feature-fields /embedding` "
             f"over {results['records']:,} MiniLM embeddings of real reviews, the intent head (157-way "
             "logistic regression) served by a KServe ModelServer over V2 REST behind a counting proxy, "
             f"{results['repeats']} interleaved rounds, median; records/s from the run's first request at "
             "the server (the proxy's clock) to its last output's broker stamp, in process between the "
             "first and the last output's stamp; server, broker and job share the machine; "
             f"{results['machine']}.", "",
             *_table({k: v for k, v in rows.items()
                      if not k.startswith(("remote gRPC", DIRECT)) and k != TRITON_DIRECT},
                     "remote, 1 row per request" if _refused(rows) else TRITON), ""]
    lines += _binding_table(rows)
    refused = _refused(rows)
    if TRITON in rows and not refused:
        lines += [f"{TRITON}: Flink's async ML_PREDICT, {results.get('ml_predict_concurrency', 10)} requests "
                  "in flight, one row per request, at-least-once sink. As released it runs no model, so "
                  "the bench gives it what it needs (`bench/_triton_provider.py`): its two planning "
                  "faults (a schema check that passes only when the types differ, a non-serializable "
                  "field in its function) repaired in a subclass whose requests, client and parsing stay "
                  "Flink's; the head served again with its tensors named in capitals "
                  "(`intent_head_caps`: the provider upper-cases the names it sends); and its "
                  "`/versions/latest` path segment, which it always sends and KServe answers with 501, "
                  "dropped: by the proxy in the first table, by the server itself "
                  "(`tests/servers/kserve_onnx.py --any-version`) in the second.", ""]
        if TRITON_DIRECT in rows:
            through, direct = (statistics.median(r["records"] / r["output_span_s"] for r in rows[TRITON]),
                               statistics.median(r["records"] / r["span_s"] for r in rows[TRITON_DIRECT]))
            ours = [(size, _span_rate(rows, f"remote, {size} rows per request"),
                     _span_rate(rows, f"{DIRECT} REST, {size} rows per request")) for size in (16, 64)]
            ours_text = "; ".join(f"ours over REST at {size} rows per request {a:.0f} through it and {b:.0f} "
                                  "straight" for size, a, b in ours if a is not None and b is not None)
            lines += [f"The proxy is a Python process on the same two cores: {TRITON}'s one request per row "
                      f"made {through:.0f} records/s through it and {direct:.0f} straight to the server "
                      f"(output spans){'; ' + ours_text if ours_text else ''}. The second table is the fair "
                      "comparison.", ""]
            if rows.get("in process"):
                ceiling = statistics.median(r["records_per_s"] for r in rows["in process"])
                grpc = max((_span_rate(rows, n) or 0.0 for n in rows if n.startswith("remote gRPC")),
                           default=0.0)
                lines += [f"The job with the head in process (no server, no request) made {ceiling:.0f} "
                          f"records/s, {ceiling / direct:.2f}x {TRITON} straight to the server"
                          + (f"; over gRPC it made up to {grpc:.0f}, as much within the spread "
                             "of the rounds: the head is a small part of the job's work beside decoding and "
                             "rendering the records, and the binding adds little to it."
                             if grpc > 0.9 * ceiling else
                             ": on this machine that is about the most a remote binding of the job could "
                             "reach, whatever the server."), ""]
    if refused:
        lines += [f"{TRITON} refuses every model at planning, before any request: `{refused}` (its "
                  "single-column check in `AbstractTritonModelFunction` fails whatever the column's type; "
                  "2.3.0 is its only release). One row per request, the rows above, is the shape it would "
                  "send.", ""]
    if "embeddings" in results:
        emb = results["embeddings"]
        lines += [f"Embeddings of {emb['texts']:,} real reviews on an OpenAI-compatible server: llama.cpp's "
                  "`llama-server --embeddings` (SmolLM2-135M Q4_1, mean pooling, one slot) behind the same "
                  f"proxy; {OPENAI} async with {emb['ml_predict_concurrency']} requests in flight; ours "
                  "`--remote-api openai-embeddings`; a fresh server per run (it keeps the prompts it "
                  "has seen); same rounds and measure; "
                  f"{emb['machine']}.", "",
                  *_table(emb["jobs"], OPENAI), "",
                  "Here the server's own compute bounds every case: one slot embeds one text at a time "
                  "on the machine's two cores, whether the texts come one per request or many, so batching "
                  "saves requests, not time. The gain over one row per request needs a server that is "
                  "not compute-bound (the V2 rows above).", ""]
    lines += ["Raw numbers: `remote_results.json`.", ""]
    return "\n".join(lines)


def embedding_cases(bootstrap: str, folder: Path, reviews: list[str],
                    args: argparse.Namespace) -> dict[str, Any]:
    """The OpenAI-compatible cases: Flink's ML_PREDICT and ours on one llama-server."""
    records = [{"tx": f"e{i}", "text": reviews[i % len(reviews)]} for i in range(args.texts)]
    create_stamped_topics(bootstrap, ["texts"])
    assert ingest_records(bootstrap, "texts", records, progress=False).delivered == len(records)
    ours = ("--text-field", "/text", "--id-field", "/tx", "--remote-api", "openai-embeddings",
            "--remote-model", "smollm2-embed", "--remote-request-timeout-s", "60",
            "--remote-deadline-s", "600")
    cases = {"remote, 1 row per request": ("--remote-rows-per-request", "1"),
             "remote, 16 rows per request": ("--remote-rows-per-request", "16")}
    jobs: dict[str, list[dict[str, Any]]] = {name: [] for name in [OPENAI, *cases]}
    for round_ in range(args.repeats):
        for i, name in enumerate(jobs):
            # a fresh server per run: llama-server keeps the prompts it has seen (a warm run of the same
            # texts measured 535 records/s beside 39 cold)
            server = launch.llama_server(launch.smollm2_gguf(), "smollm2-embed", folder / f"llama-{i}.log",
                                         embeddings=True, parallel=1)
            with server as url, FaultProxy(url) as proxy:
                before, since = proxy.requests(EMBED), time.time()
                out = f"emb-{round_}-{i}"
                if name == OPENAI:
                    result = run_ml_predict(bootstrap, "texts", out, len(records), "openai",
                                            f"{proxy.url}{EMBED}", "smollm2-embed",
                                            args.ml_predict_concurrency)
                    if "error" in result:
                        raise RuntimeError(f"{OPENAI}: {result['error']}")
                else:
                    result = run_job(bootstrap, "texts", out, len(records),
                                     (*ours, "--remote-url", proxy.url, *cases[name]))
                result = from_first_request(result, proxy, since, EMBED,
                                            collect_stamps(bootstrap, out, want=len(records), timeout_s=60))
                result["requests_per_record"] = (proxy.requests(EMBED) - before) / len(records)
                print(f"round {round_ + 1} {name}: {result['records_per_s']:.0f} records/s", flush=True)
                jobs[name].append(result)
    return {"texts": len(records), "ml_predict_concurrency": args.ml_predict_concurrency, "jobs": jobs,
            "machine": machine()}


def v2_cases(bootstrap: str, folder: Path, reviews: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The V2 cases: in process; through the counting proxy ours at 1 / 16 / 64 rows per request and
    Flink's ML_PREDICT; straight to the server ours over REST (JSON lists and binary) and gRPC at 16 / 64
    rows per request and Flink's ML_PREDICT."""
    build_minilm_encoder(folder / "minilm")
    head = build_intent_head(folder / "intent-head.onnx")
    caps = capitalized_model(head, folder / "intent-head-caps.onnx")
    triton_jar = provider_jar(folder)
    encoder = OnnxEncoderHandler(model_path=folder / "minilm" / "model.onnx",
                                 tokenizer_path=folder / "minilm" / "tokenizer.json",
                                 pooling=Pooling.NONE)
    unique = reviews[:min(args.records, len(reviews))]  # encoded once, in chunks, then cycled
    model = encoder.load_model()
    vectors = np.concatenate([np.stack(encoder.run_inference(unique[i:i + 512], model))
                              for i in range(0, len(unique), 512)])
    records = [{"tx": f"t{i}", "embedding": vectors[i % len(unique)].tolist()} for i in range(args.records)]
    create_stamped_topics(bootstrap, ["features"])
    assert ingest_records(bootstrap, "features", records, progress=False).delivered == len(records)
    grpc_port = find_free_port()
    server = launch.kserve_server({"intent_head": head, "intent_head_caps": caps}, folder / "kserve.log",
                                  grpc_port=grpc_port, any_version=True)
    with server as url, FaultProxy(url, rewrite=without_version) as proxy:
        common = ("--feature-fields", "/embedding", "--id-field", "/tx")
        model = ("--remote-model", "intent_head")
        via, direct = ("--remote-url", proxy.url, *model), ("--remote-url", url, *model)
        grpc = ("--remote-url", f"grpc://127.0.0.1:{grpc_port}", *model)
        cases: dict[str, tuple[str, ...]] = {
            "in process": ("--predictor", str(head)),
            "remote, 1 row per request": (*via, "--remote-rows-per-request", "1"),
            "remote, 16 rows per request": (*via, "--remote-rows-per-request", "16"),
            "remote, 64 rows per request": (*via, "--remote-rows-per-request", "64"),
            **{f"{DIRECT} REST, {n} rows per request": (*direct, "--remote-rows-per-request", n)
               for n in ("16", "64")},
            **{f"{DIRECT} REST binary, {n} rows per request": (*direct, "--remote-rows-per-request", n,
                                                             "--remote-v2-binary") for n in ("16", "64")},
            **{f"remote gRPC, {n} rows per request": (*grpc, "--remote-rows-per-request", n)
               for n in ("16", "64")}}
        jobs: dict[str, list[dict[str, Any]]] = {name: [] for name in [*cases, TRITON, TRITON_DIRECT]}
        for round_ in range(args.repeats):
            for name, endpoint in ((TRITON, proxy.url), (TRITON_DIRECT, url)):
                if round_ > 0 and "error" in jobs[name][0]:
                    continue
                before, since = proxy.requests(CAPS_INFER), time.time()
                out = f"mlp-{round_}-{len(jobs[name])}-{name == TRITON}"
                result = run_ml_predict(bootstrap, "features", out, len(records), "triton",
                                        f"{endpoint}/v2/models", "intent_head_caps",
                                        args.ml_predict_concurrency, (triton_jar,))
                if "error" not in result and name == TRITON:  # refused: no stamps to time
                    stamps = collect_stamps(bootstrap, out, want=len(records), timeout_s=60)
                    result = from_first_request(result, proxy, since, CAPS_INFER, stamps)
                    result["requests_per_record"] = (proxy.requests(CAPS_INFER) - before) / len(records)
                print(f"round {round_ + 1} {name}: {result.get('error') or result['records_per_s']}",
                      flush=True)
                jobs[name].append(result)
            for i, (name, flags) in enumerate(cases.items()):
                counted = name.startswith("remote, ")
                before, since = proxy.requests(INFER), time.time()
                out = f"out-{round_}-{i}"
                result = run_job(bootstrap, "features", out, len(records), (*common, *flags))
                if counted:
                    stamps = collect_stamps(bootstrap, out, want=len(records), timeout_s=60)
                    result = from_first_request(result, proxy, since, INFER, stamps)
                    result["requests_per_record"] = (proxy.requests(INFER) - before) / len(records)
                print(f"round {round_ + 1} {name}: {result['records_per_s']:.0f} records/s", flush=True)
                jobs[name].append(result)
    return {"records": len(records), "repeats": args.repeats, "jobs": jobs, "machine": machine(),
            "ml_predict_concurrency": args.ml_predict_concurrency}


def main(argv: list[str] | None = None) -> int:
    """Run the cases and write the report."""
    args = parse_args(argv)
    if args.report_only:
        results = json.loads((args.out_dir / "remote_results.json").read_text())
        replace_section(args.out_dir / "REPORT.md", SECTION, section(results))
        return 0
    reviews = load_rotten_tomatoes()
    path = args.out_dir / "remote_results.json"
    results: dict[str, Any] = json.loads(path.read_text()) if args.part != "all" else {}
    with tempfile.TemporaryDirectory(prefix="aisp-remote-bench-") as tmp, bench_broker() as bootstrap:
        folder = Path(tmp)
        if args.part in ("all", "v2"):
            results.update(v2_cases(bootstrap, folder, [r.text for r in reviews], args))
        if args.part in ("all", "embeddings"):
            results["embeddings"] = embedding_cases(bootstrap, folder, [r.text for r in reviews], args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    replace_section(args.out_dir / "REPORT.md", SECTION, section(results))
    return 0

if __name__ == "__main__":
    sys.exit(main())
