"""A minute of 429s under a running job (issue 22): no failure, no restart, each record once, and
the adaptive concurrency settles.

Not a test. Starts its own local stack (Kafka broker + Flink standalone cluster) and a KServe
ModelServer (``tests/servers/kserve_onnx.py``, ``make servers``) serving the intent head (157-way
logistic regression on 384-d MiniLM embeddings) over Open Inference Protocol v2 REST, behind
:class:`pyflink_aisp.chaos.FaultProxy`. The packaged job runs in STREAMING mode (``flink run``,
exactly-once) with ``--remote-url`` on the proxy while a producer writes embeddings of real reviews at
``--rate`` records/s; after ``--calm-s`` seconds the proxy answers ``429 Too Many Requests`` (with
``Retry-After: 1``) to ``--share`` of the ``/infer`` requests for ``--fault-s`` seconds, then heals.
Read off, side by side on one clock:

* the requests in flight at the proxy every 0.5 s (the workers' concurrency as the server's door sees
  it) and the 429s per second;
* the job's ``numRestarts`` (Flink REST) at the end;
* every record's outputs and dead letters, by id (each once, or a dead letter with its reason).

Run (about 5 min on 2 cores)::

    .venv/bin/python bench/remote_throttle.py [--rate 40] [--fault-s 60] [--share 0.3]

It writes ``## Remote models: a minute of 429s`` into ``bench/REPORT.md``, the plot
``bench/remote_throttle.png`` and the raw numbers ``bench/remote_throttle.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from _markdown import replace_section
from _report import machine
from confluent_kafka import Producer

from pyflink_aisp.chaos import FaultProxy, Faults, job_restarts
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxEncoderHandler, Pooling
from pyflink_aisp.kafka import create_topics, read_topic
from pyflink_aisp.local import LocalStack, LocalStackConfig
from pyflink_aisp.models import build_intent_head, build_minilm_encoder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "servers"))
import launch  # noqa: E402  (tests/servers: the KServe server's launcher)

SECTION = "## Remote models: a minute of 429s"
PNG = "remote_throttle.png"
INFER = "/infer"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=40.0, help="records/s written")
    p.add_argument("--calm-s", type=float, default=20.0, help="seconds before and after the faults")
    p.add_argument("--fault-s", type=float, default=60.0)
    p.add_argument("--share", type=float, default=0.3, help="share of /infer requests answered 429")
    p.add_argument("--rows-per-request", type=int, default=4)
    p.add_argument("--texts", type=int, default=600, help="distinct reviews embedded (records cycle them)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench")
    return p.parse_args(argv)


def produce(bootstrap: str, topic: str, vectors: np.ndarray, rate: float, seconds: float) -> list[str]:
    """``{"tx", "embedding"}`` records at ``rate`` per second for ``seconds``; their ids."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    ids: list[str] = []
    t0 = time.time()
    total = int(rate * seconds)
    while len(ids) < total:
        due = min(total, int((time.time() - t0) * rate) + 1)
        while len(ids) < due:
            tx = f"t{len(ids)}"
            value = json.dumps({"tx": tx, "embedding": vectors[len(ids) % len(vectors)].tolist()})
            producer.produce(topic, key=tx.encode(), value=value.encode())
            ids.append(tx)
        producer.poll(0)
        time.sleep(max(0.0, t0 + len(ids) / rate - time.time()))
    producer.flush(30)
    return ids


def timeline(proxy: FaultProxy, t0: float, t1: float, step: float = 0.5) -> dict[str, list[float]]:
    """Mean requests in flight at the proxy and requests arriving per second, per ``step`` seconds."""
    times = np.arange(t0, t1, step)
    spans = [s for path, ss in proxy.spans.items() if path.endswith(INFER) for s in ss]
    starts = np.array([s[0] for s in spans], dtype=np.float64)
    ends = np.array([s[1] if s[1] is not None else np.inf for s in spans], dtype=np.float64)
    ends = np.minimum(ends, t1)
    # time-averaged requests in flight per bin (the overlap of each request with the bin / the bin): a
    # request takes milliseconds, so an instant's count would mostly read 0
    inflight = [float(np.clip(np.minimum(ends, t + step) - np.maximum(starts, t), 0, None).sum() / step)
                for t in times]
    arrivals = np.array([t for path, ts in proxy.arrivals.items() if path.endswith(INFER) for t in ts],
                        dtype=np.float64)
    per_s = [float(np.count_nonzero((arrivals >= t) & (arrivals < t + step))) / step for t in times]
    return {"t": [float(t - t0) for t in times], "inflight": inflight, "requests_per_s": per_s}


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    line = data["timeline"]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(line["t"], line["inflight"], label="mean requests in flight at the server's door", lw=1.2)
    ax.plot(line["t"], line["requests_per_s"], label="requests arriving per s", lw=0.8, alpha=0.6)
    ax.axvspan(data["fault_start_s"], data["fault_end_s"], color="tab:red", alpha=0.12,
               label=f"{data['share']:.0%} of requests answered 429")
    ax.set_xlabel("seconds since the first record was written")
    ax.set_ylabel("requests")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("Adaptive concurrency under a minute of 429s (one worker)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(data: dict[str, Any]) -> str:
    line = data["timeline"]
    t = np.array(line["t"])
    inflight = np.array(line["inflight"])

    def mean_in(lo: float, hi: float) -> float:
        picked = inflight[(t >= lo) & (t < hi)]
        return float(picked.mean()) if picked.size else float("nan")

    def rate_in(lo: float, hi: float) -> float:
        picked = np.array(line["requests_per_s"])[(t >= lo) & (t < hi)]
        return float(picked.mean()) if picked.size else float("nan")

    fs, fe = data["fault_start_s"], data["fault_end_s"]
    # numRestarts is not always served by the REST API; the exception history always is
    ok = (data["restarts"] in (0, None) and data["job_exceptions"] == 0
          and data["missing"] == 0 == data["duplicated"])
    return "\n".join([
        SECTION, "",
        f"`bench/remote_throttle.py`: the packaged job (STREAMING, `flink run`, exactly-once) on "
        f"{data['records']} embeddings of real reviews written at {data['rate']:g} records/s, the intent "
        f"head on a KServe ModelServer (V2 REST, `--remote-rows-per-request {data['rows_per_request']}`) "
        f"behind a proxy that answered 429 (Retry-After 1 s) to {data['share']:.0%} of the `/infer` "
        f"requests for {data['fault_end_s'] - data['fault_start_s']:.0f} s.", "",
        f"Machine: {data['machine']}", "",
        "| | value |", "|---|---|",
        f"| job restarts (`numRestarts`; - where REST did not serve it) / entries of its exception history | "
        f"{'-' if data['restarts'] is None else data['restarts']} / {data['job_exceptions']} |",
        f"| records written / scored / dead letters | {data['records']} / {data['scored']} / "
        f"{data['dead_letters']} ({data['dlq_reasons'] or 'none'}) |",
        f"| missing / duplicated outputs | {data['missing']} / {data['duplicated']} |",
        f"| /infer requests: forwarded / answered 429 | {data['forwarded']} / {data['rate_limited']} |",
        f"| mean requests in flight: before / during / after the 429s | {mean_in(0, fs):.2f} / "
        f"{mean_in(fs, fe):.2f} / {mean_in(fe, t.max() if t.size else fe):.2f} |",
        f"| requests arriving per s: before / during / after | {rate_in(0, fs):.1f} / "
        f"{rate_in(fs, fe):.1f} / "
        f"{rate_in(fe, t.max() if t.size else fe):.1f} |", "",
        f"No failure, no restart, each record once: **{'met' if ok else 'NOT met'}**. Each 429 halves the "
        "worker's limit and holds it for the Retry-After; between them the limit grows by one per round "
        "trip, so concurrency settles low while the 429s last and climbs back after. Raw numbers: "
        "`remote_throttle.json`.", "", f"![concurrency under 429s]({PNG})", ""])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seconds = 2 * args.calm_s + args.fault_s
    with tempfile.TemporaryDirectory(prefix="aisp-remote-throttle-") as tmp:
        work = Path(tmp)
        build_minilm_encoder(work / "minilm")
        head = build_intent_head(work / "intent-head.onnx")
        encoder = OnnxEncoderHandler(model_path=work / "minilm" / "model.onnx",
                                     tokenizer_path=work / "minilm" / "tokenizer.json", pooling=Pooling.NONE)
        texts = [r.text for r in load_rotten_tomatoes()[: args.texts]]
        vectors = np.stack(encoder.run_inference(texts, encoder.load_model()))
        stack = LocalStack(LocalStackConfig.on_free_ports(work / "stack"))
        stack.up()
        try:
            with launch.kserve_server({"intent_head": head}, work / "kserve.log") as url, \
                    FaultProxy(url, Faults(path_suffix=INFER)) as proxy:
                data = run(stack, proxy, vectors, args, seconds, work)
        finally:
            stack.down()
    data["machine"] = machine()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "remote_throttle.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data, args.out_dir / PNG)
    replace_section(args.out_dir / "REPORT.md", SECTION, section(data))
    print(json.dumps({k: v for k, v in data.items() if k != "timeline"}, indent=2))
    clean = data["restarts"] in (0, None) and data["job_exceptions"] == 0
    return 0 if clean and data["missing"] == data["duplicated"] == 0 else 1


def run(stack: LocalStack, proxy: FaultProxy, vectors: np.ndarray, args: argparse.Namespace,
        seconds: float, work: Path) -> dict[str, Any]:
    status = stack.status()
    bootstrap, rest = str(status.bootstrap_servers), str(status.rest_url)
    topic = "throttle-in"
    create_topics(bootstrap, [topic, f"{topic}-out", f"{topic}-out.dlq"])
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--mode", "streaming", "--bootstrap-servers", bootstrap,
        "--input-topic", topic, "--output-topic", f"{topic}-out", "--feature-fields", "/embedding",
        "--id-field", "/tx", "--remote-url", proxy.url, "--remote-model", "intent_head",
        "--remote-rows-per-request", str(args.rows_per_request), "--remote-deadline-s", "120",
        "--checkpoint-interval-ms", "5000")
    cmd.insert(cmd.index("run") + 1, "-d")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])
    job_id = re.search(r"JobID ([0-9a-f]{32})", proc.stdout).group(1)  # type: ignore[union-attr]
    ids: list[str] = []
    try:
        writer = threading.Thread(target=lambda: ids.extend(produce(bootstrap, topic, vectors, args.rate,
                                                                    seconds)), daemon=True)
        t0 = time.time()
        writer.start()
        time.sleep(args.calm_s)
        fault_start = time.time()
        proxy.set_faults(Faults(rate_limited=args.share, retry_after_s=1, path_suffix=INFER))
        print(f"[{time.strftime('%X')}] 429s on", flush=True)
        time.sleep(args.fault_s)
        proxy.heal()
        fault_end = time.time()
        print(f"[{time.strftime('%X')}] healed", flush=True)
        writer.join()
        out = read_topic(bootstrap, f"{topic}-out", min_count=len(ids), timeout_s=300, quiet_s=10)
        dlq = read_topic(bootstrap, f"{topic}-out.dlq", timeout_s=30, quiet_s=5)
        t1 = time.time()
        restarts = job_restarts(rest, job_id, timeout_s=10)
        failures = _exceptions(rest, job_id)
    finally:
        subprocess.run([stack.flink_run_command("x")[0], "cancel", job_id], env=stack.flink_env(),
                       capture_output=True, timeout=120)
    counts = Counter(str(json.loads(m.value()).get("id")) for m in out)
    letters = [json.loads(m.value()) for m in dlq]
    lettered = Counter(str(x.get("id")) for x in letters)
    return {
        "rate": args.rate, "share": args.share, "rows_per_request": args.rows_per_request,
        "records": len(ids), "scored": sum(counts.values()), "dead_letters": len(letters),
        "dlq_reasons": dict(Counter(x.get("reason") for x in letters)),
        "missing": sum(1 for i in ids if counts[i] + lettered[i] == 0),
        "duplicated": sum(1 for i in ids if counts[i] + lettered[i] > 1),
        "restarts": restarts, "job_exceptions": failures,
        "forwarded": _count(proxy, "forwarded"), "rate_limited": _count(proxy, "rate_limited"),
        "fault_start_s": fault_start - t0, "fault_end_s": fault_end - t0,
        "timeline": timeline(proxy, t0, t1)}


def _exceptions(rest: str, job_id: str) -> int | None:
    """Entries of the job's exception history (Flink REST ``/jobs/:jobid/exceptions``): 0 when it
    never failed; None when the REST API did not answer."""
    import httpx

    try:
        body = httpx.get(f"{rest.rstrip('/')}/jobs/{job_id}/exceptions", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None
    return len((body.get("exceptionHistory") or {}).get("entries") or [])


def _count(proxy: FaultProxy, outcome: str) -> int:
    return sum(n for (path, o), n in proxy.counts.items() if path.endswith(INFER) and o == outcome)


if __name__ == "__main__":
    sys.exit(main())
