"""Avro decode beside JSON, per record and per Arrow batch (issue 21). Not a test.

The same 12,808 Rotten Tomatoes reviews as ``{"review_id", "body", "lang"}``: as JSON, and as Avro
in the Confluent wire format (written by ``fastavro``, schema id 1). Each pass runs the job's
decoder (``decode_record``, as the Arrow operator calls it) over every record, in batches of 1,024
(the default ``python.fn-execution.arrow.batch.size``), mapping ``--text-field /body --id-field
/review_id --keep-fields /lang``; best of 9 interleaved passes. The Avro schema comes from a
stand-in registry answering in-process: it is fetched once per schema id and cached, so what is
measured is the decode, not the fetch. Beside both: the sentiment job's time per record from
``bench/task_results.json`` (same machine type when run in one session). Run (seconds)::

    .venv/bin/python bench/decode_bench.py

It writes ``## Avro decode beside JSON`` into ``bench/REPORT.md`` and ``bench/decode_results.json``.
"""

from __future__ import annotations

import io
import json
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

import fastavro
import httpx
from _markdown import replace_section
from _report import machine

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import DecodedRecord, FieldMapping, _avro, decode_record

OUT = Path(__file__).resolve().parent
SECTION = "## Avro decode beside JSON"
SCHEMA = {"type": "record", "name": "Review", "fields": [
    {"name": "review_id", "type": "string"}, {"name": "body", "type": "string"},
    {"name": "lang", "type": "string"}]}
URL = "http://registry.invalid/apis/ccompat/v7"
BATCH = 1024


def _get(url: str, **_: Any) -> httpx.Response:
    return httpx.Response(200, json={"schema": json.dumps(SCHEMA)}, request=httpx.Request("GET", url))


def _avro_value(record: dict[str, str], schema: Any) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema, record)
    return b"\x00" + struct.pack(">I", 1) + body.getvalue()


def _pass_us(values: list[bytes], mapping: FieldMapping) -> float:
    """One pass in Arrow-batch-sized chunks, microseconds per record."""
    start = time.perf_counter()
    for i in range(0, len(values), BATCH):
        for offset, value in enumerate(values[i:i + BATCH], start=i):
            decode_record(value, "t", 0, offset, mapping)
    return (time.perf_counter() - start) / len(values) * 1e6


def main() -> int:
    reviews = load_rotten_tomatoes()
    records = [{"review_id": r.id, "body": r.text, "lang": "en"} for r in reviews]
    parsed = fastavro.parse_schema(SCHEMA)
    values = {"json": [json.dumps(d).encode() for d in records],
              "avro": [_avro_value(d, parsed) for d in records]}
    keep = {"text": "/body", "id": "/review_id", "keep": ("/lang",)}
    mappings = {"json": FieldMapping(**keep),
                "avro": FieldMapping(**keep, value_format="avro", schema_registry_url=URL)}
    _avro._CLIENTS[URL] = _avro.SchemaRegistryClient(URL, get=_get)
    for name in values:  # both decode to the same records
        got = [decode_record(v, "t", 0, i, mappings[name]) for i, v in enumerate(values[name][:50])]
        assert all(isinstance(d, DecodedRecord) for d in got)
        assert [(d.id, d.text, d.kept) for d in got] == [(r["review_id"], r["body"], (("lang", "en"),))
                                                          for r in records[:50]]
    runs: dict[str, list[float]] = {name: [] for name in values}
    for _ in range(9):
        for name in values:
            runs[name].append(_pass_us(values[name], mappings[name]))
    sizes = {name: statistics.mean(len(v) for v in values[name]) for name in values}
    jobs = json.loads((OUT / "task_results.json").read_text())
    job_us = 1e6 / statistics.median(r["records_per_s"] for r in jobs["jobs"]["sentiment, mapped"])
    results = {"records": len(records), "batch": BATCH, "us_per_record": {k: min(v) for k, v in runs.items()},
               "all_passes_us": runs, "mean_value_bytes": sizes, "job_us_per_record": job_us,
               "job_machine": jobs["machine"].split(",")[0], "machine": machine()}
    (OUT / "decode_results.json").write_text(json.dumps(results, indent=2) + "\n")
    replace_section(OUT / "REPORT.md", SECTION, section(results))
    print(section(results))
    return 0


def section(results: dict[str, Any]) -> str:
    """The report section."""
    us, size = results["us_per_record"], results["mean_value_bytes"]
    per_batch = {k: v * results["batch"] / 1000 for k, v in us.items()}
    lines = [SECTION, "",
             f"`bench/decode_bench.py`: the job's decoder over {results['records']:,} real reviews "
             "`{review_id, body, lang}` mapped by `--text-field /body --id-field /review_id --keep-fields "
             f"/lang`, in batches of {results['batch']:,}, best of 9 interleaved passes; "
             f"{results['machine']}.",
             "", "| format | mean value bytes | us per record | ms per Arrow batch | vs json |",
             "|---|---|---|---|---|"]
    for name in ("json", "avro"):
        lines.append(f"| {name} | {size[name]:.0f} | {us[name]:.2f} | {per_batch[name]:.2f} | "
                     f"{us[name] / us['json']:.2f}x |")
    job = results["job_us_per_record"]
    lines += ["", f"Avro costs {us['avro'] - us['json']:+.2f} us per record beside JSON: "
              f"{(us['avro'] - us['json']) / job:+.2%} of the mapped sentiment job's {job:.0f} us per record "
              f"(`task_results.json`: an earlier run, on an {results['job_machine']}). The schema is "
              "fetched once per id and cached per worker (not in these numbers). Raw numbers: "
              "`decode_results.json`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
