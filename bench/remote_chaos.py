"""TaskManager kills during a generation stream, with and without the call log (issue 22).

Not a test. Starts its own local stack (Kafka broker + Flink standalone cluster), llama.cpp's
OpenAI-compatible ``llama-server`` (SmolLM2-135M-Instruct, ``make servers``) behind
:class:`pyflink_aisp.chaos.FaultProxy` with no faults (it counts the requests at the server's door
and when each was in flight), and runs :func:`pyflink_aisp.chaos.run_chaos`: the packaged job in
STREAMING mode, exactly-once, generating one chat completion per review, while the TaskManager
running it is killed with ``kill -9`` (its Python worker too) ``--kills`` times, each after a fresh
chunk of records. Two runs, one after the other, on the same records, each on a fresh server (it
keeps the prompts it has seen, which would speed up the second):

* ``no call log``: every record since the last checkpoint is sent again after a kill;
* ``call log``: ``--remote-call-log`` (a compacted topic of its own per run): records replayed after
  a kill are answered from the log.

Per run: records in and out, lost and duplicated outputs (by id), chat requests at the proxy, and
the requests in flight at each kill (the ones a kill may cut off, which are made again). The
target (issue 22): 0 lost, 0 duplicated, requests ≤ 1.05 x records + requests in flight at the
kills, with the call log. Run (about 10 min on 2 cores)::

    .venv/bin/python bench/remote_chaos.py [--records 120] [--kills 5]

It writes ``## Remote models: TaskManager kills during generation`` into ``bench/REPORT.md`` and the
raw numbers into ``bench/remote_chaos.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from _markdown import replace_section
from _report import machine

from pyflink_aisp.chaos import FailurePlan, FaultProxy, run_chaos
from pyflink_aisp.kafka import read_topic
from pyflink_aisp.local import LocalStack, LocalStackConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "servers"))
import launch  # noqa: E402  (tests/servers: the llama-server launcher)

SECTION = "## Remote models: TaskManager kills during generation"
CHAT = "/v1/chat/completions"
TEMPLATE = "Summarise this movie review in five words.\nReview: {text}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=120)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--checkpoint-interval-ms", type=int, default=10000,
                   help="the job's (records answered since the last checkpoint are replayed after a kill)")
    p.add_argument("--pause-s", type=float, default=4.0, help="scoring time before each kill")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench")
    return p.parse_args(argv)


def one_run(stack: LocalStack, proxy: FaultProxy, args: argparse.Namespace, work: Path,
            call_log: bool) -> dict[str, Any]:
    """One chaos run of the generation job; its counts."""
    plan = FailurePlan(records=args.records, taskmanager_kills=args.kills, broker_restarts=0,
                       checkpoint_interval_ms=args.checkpoint_interval_ms, pause_s=args.pause_s)
    model_args = ["--remote-url", proxy.url, "--remote-api", "openai-chat", "--remote-model", "smollm2",
                  "--prompt-template", TEMPLATE, "--max-tokens", str(args.max_tokens),
                  "--remote-request-timeout-s", "60", "--remote-deadline-s", "300"]
    log_topic = f"calls-{uuid.uuid4().hex[:8]}"
    if call_log:
        model_args += ["--remote-call-log", log_topic]
    before = proxy.requests(CHAT)
    result = run_chaos(stack, plan, job_py=ROOT / "jobs" / "review_sentiment.py", model_dir=None,
                       work_dir=work, model_args=model_args,
                       on_event=lambda i, e: print(f"[{time.strftime('%X')}] kill {i + 1}: {e.kind}, "
                                                   f"recovered in {e.recovery_s}", flush=True))
    inflight = [proxy.inflight_at(e.at, CHAT) for e in result.events]
    kinds: Counter[str] = Counter()
    if call_log:  # the log's entries, latest per key
        latest = {m.key(): json.loads(m.value()) for m in read_topic(
            str(stack.status().bootstrap_servers), log_topic, timeout_s=30, read_committed=False)}
        kinds.update(e["kind"] for e in latest.values())
    requests = proxy.requests(CHAT) - before
    records = len(result.input_ids)
    return {"call_log": call_log, "records": records, "outputs": sum(result.output_counts.values()),
            "lost": len(result.lost), "duplicates": result.duplicates, "dlq": result.dlq_count,
            "requests": requests, "requests_per_record": requests / records,
            "inflight_at_kills": inflight, "bound": 1.05 * records + sum(inflight),
            "recovery_s": [e.recovery_s for e in result.events], "wall_s": result.wall_s,
            "log_entries": dict(kinds)}


def section(runs: list[dict[str, Any]], machine_line: str, args: argparse.Namespace) -> str:
    rows = [f"| {'call log' if r['call_log'] else 'no call log'} | {r['records']} | {r['outputs']} | "
            f"{r['lost']} | {r['duplicates']} | {r['requests']} | {r['requests_per_record']:.2f} | "
            f"{sum(r['inflight_at_kills'])} ({', '.join(map(str, r['inflight_at_kills']))}) | "
            f"{r['bound']:.0f} |" for r in runs]
    logged = next(r for r in runs if r["call_log"])
    met = logged["lost"] == logged["duplicates"] == 0 and logged["requests"] <= logged["bound"]
    return "\n".join([
        SECTION, "",
        f"`bench/remote_chaos.py`: {args.records} reviews, {args.kills} TaskManager kills (`kill -9`, its "
        f"Python worker too) during a STREAMING generation job (llama-server, SmolLM2-135M-Instruct, chat, "
        f"`--max-tokens {args.max_tokens}`), exactly-once, checkpoints every "
        f"{args.checkpoint_interval_ms} ms; "
        "requests counted at the proxy in front of the server.", "",
        f"Machine: {machine_line}", "",
        "| run | records | outputs | lost | duplicated | chat requests | requests per record | "
        "in flight at the kills | bound 1.05 x records + in flight |",
        "|---|---|---|---|---|---|---|---|---|", *rows, "",
        "Target with the call log (0 lost, 0 duplicated, requests ≤ the bound): "
        f"**{'met' if met else 'NOT met'}**. "
        "Without it, every record scored since the last completed checkpoint is sent again after each kill. "
        "Raw numbers: `remote_chaos.json`.", ""])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine_line = machine()
    runs = []
    with tempfile.TemporaryDirectory(prefix="aisp-remote-chaos-") as tmp:
        work = Path(tmp)
        stack = LocalStack(LocalStackConfig.on_free_ports(work / "stack"))
        print(f"[{time.strftime('%X')}] starting the stack and llama-server in {tmp}", flush=True)
        stack.up()
        try:
            for i, call_log in enumerate((False, True)):  # a fresh server each: it keeps the prompts it saw
                with launch.llama_server(launch.smollm2_gguf(), "smollm2", work / f"llama-{i}.log") as url, \
                        FaultProxy(url) as proxy:
                    runs.append(one_run(stack, proxy, args, work, call_log))
                print(json.dumps(runs[-1]), flush=True)
        finally:
            stack.down()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "remote_chaos.json").write_text(json.dumps({"machine": machine_line, "runs": runs},
                                                               indent=2) + "\n")
    replace_section(args.out_dir / "REPORT.md", SECTION, section(runs, machine_line, args))
    logged = runs[1]
    return 0 if logged["lost"] == logged["duplicates"] == 0 and logged["requests"] <= logged["bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
