"""Load on the GPU affinity service: acquire / renew / release ops/s and latency with 1, 16, 200 clients.

A real server (``aisp affinity serve`` on the 2 NUMA x 4 GPU topology file, a
bearer token, SQLite in a temporary folder) runs as a subprocess on loopback.
Each client is an asyncio task with its own HTTP connection (httpx.AsyncClient)
that loops acquire → renew → release on its own subtask for the phase's duration;
latency is measured by the client around each call (request, server, response),
so at 200 clients it includes the load generator's own share of the 2 cores.
The server's own time per call (store + placement, its Prometheus histogram) is
reported beside it. Target (issue 12): p99 <= 10 ms at 200 clients on 2 cores.

Run from the repository root: ``.venv/bin/python bench/affinity_load.py``
(``--seconds 5``); writes ``bench/affinity_results.json``, ``bench/affinity_latency.png``
and the ``## Affinity service`` section of ``bench/REPORT.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _markdown import replace_section

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Affinity service"
OPS = ("acquire", "renew", "release")
TOKEN = "bench-token"


def _start_server(folder: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AISP_AFFINITY_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyflink_aisp.cli",
            "affinity",
            "serve",
            "--topology",
            str(ROOT / "tests" / "data" / "affinity" / "numa2x4.yaml"),
            "--db",
            str(folder / "leases.db"),
            "--port",
            str(port),
            "--ttl-s",
            "60",
        ],
        env=env,
        stdout=(folder / "server.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"server did not start: {(folder / 'server.log').read_text()}")


class _Connection:
    """One keep-alive HTTP/1.1 connection over asyncio streams: the load generator's per-call
    CPU must stay well below the server's, and httpx's async pool did not (measured here at
    16 clients: the client process at 61 % CPU, the server at 33 %)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> _Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        payload = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.writer.write(head.encode() + payload)
        headers = await self.reader.readuntil(b"\r\n\r\n")
        status = int(headers[9:12])
        length = next(
            int(line.split(b":")[1])
            for line in headers.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def _client(
    conn: _Connection, index: int, phase: str, until: float, lat: dict[str, list[float]], interval_s: float
) -> int:
    errors = 0
    body = {"job": f"bench-{phase}", "operator": "score", "subtask": index, "mem_bytes": 2**20}
    # paced: start at a random point of the interval, then one cycle per interval
    next_at = time.perf_counter() + random.Random(index).uniform(0, interval_s)
    while time.perf_counter() < until:
        if interval_s:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            next_at += interval_s
        t0 = time.perf_counter()
        status, answer = await conn.call("POST", "/v1/leases", body)
        t1 = time.perf_counter()
        if status not in (200, 201):
            errors += 1
            continue
        lease = json.loads(answer)["id"]
        s2, _ = await conn.call("POST", f"/v1/leases/{lease}/renew", {"ttl_s": 60})
        t2 = time.perf_counter()
        s3, _ = await conn.call("DELETE", f"/v1/leases/{lease}")
        t3 = time.perf_counter()
        errors += (s2 != 200) + (s3 != 200)
        lat["acquire"].append(t1 - t0)
        lat["renew"].append(t2 - t1)
        lat["release"].append(t3 - t2)
    return errors


def _server_seconds(url: str) -> dict[str, tuple[float, float]]:
    """Server-side (count, sum of seconds) per op from its Prometheus histogram."""
    out: dict[str, tuple[float, float]] = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        for op in OPS:
            for kind in ("count", "sum"):
                if line.startswith(f'aisp_affinity_request_seconds_{kind}{{op="{op}"}}'):
                    count, total = out.get(op, (0.0, 0.0))
                    value = float(line.split()[-1])
                    out[op] = (value, total) if kind == "count" else (count, value)
    return out


async def _phase(url: str, clients: int, seconds: float, interval_s: float = 0.0) -> dict[str, Any]:
    lat: dict[str, list[float]] = {op: [] for op in OPS}
    before = _server_seconds(url)
    port = int(url.rsplit(":", 1)[1])
    conns = [await _Connection.open(port) for _ in range(clients)]
    start = time.perf_counter()
    errors = await asyncio.gather(
        *(
            _client(c, i, f"{clients}-{interval_s}", start + seconds, lat, interval_s)
            for i, c in enumerate(conns)
        )
    )
    wall = time.perf_counter() - start
    for c in conns:
        c.close()
    after = _server_seconds(url)
    result: dict[str, Any] = {
        "clients": clients,
        "interval_s": interval_s,
        "seconds": wall,
        "errors": int(sum(errors)),
    }
    for op in OPS:
        ms = np.array(lat[op]) * 1e3
        count = after[op][0] - before.get(op, (0, 0))[0]
        server_ms = (after[op][1] - before.get(op, (0, 0))[1]) / max(count, 1) * 1e3
        result[op] = {
            "ops_per_s": len(ms) / wall,
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()),
            "server_mean_ms": server_ms,
            "n": len(ms),
            "latencies_ms": ms.tolist(),
        }
    return result


def _label(r: dict[str, Any]) -> str:
    pace = f", one cycle / {r['interval_s']:g} s each" if r["interval_s"] else ", closed loop"
    return f"{r['clients']} client(s){pace}"


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(OPS), figsize=(13, 4), sharey=True)
    for ax, op in zip(axes, OPS, strict=True):
        for r in results:
            ms = np.sort(np.array(r[op]["latencies_ms"]))
            ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms), label=_label(r))
        ax.axvline(10, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"{op} latency (client side)")
        ax.set_xlabel("ms (log); dashed: 10 ms target")
    axes[0].set_ylabel("fraction of calls")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _section(results: list[dict[str, Any]], machine: str) -> str:
    rows = [
        "| clients | op | ops/s | p50 ms | p99 ms | max ms | server mean ms | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for op in OPS:
            s = r[op]
            rows.append(
                f"| {_label(r)} | {op} | {s['ops_per_s']:.0f} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | "
                f"{s['max_ms']:.1f} | {s['server_mean_ms']:.2f} | {r['errors'] if op == 'acquire' else ''} |"
            )
    closed = [r for r in results if r["clients"] == 200 and not r["interval_s"]]
    paced = [r for r in results if r["clients"] == 200 and r["interval_s"]]
    verdicts = []
    for name, group in (("closed loop", closed), ("paced", paced)):
        if group:
            worst = max(group[0][op]["p99_ms"] for op in OPS)
            verdicts.append(
                f"200 clients {name}: worst p99 {worst:.1f} ms, "
                f"{'meets' if worst <= 10 else 'misses'} the 10 ms target"
            )
    return (
        f"{SECTION}\n\n`bench/affinity_load.py`: a real `aisp affinity serve` (uvicorn, httptools, uvloop, "
        "one process, SQLite WAL, bearer token) on loopback, the 2 NUMA x 4 GPU topology file; each client "
        "(an asyncio task, own keep-alive connection) loops acquire → renew → release, back to back (closed "
        "loop) or one cycle per interval (paced); latency measured by the client around each call. "
        f"Machine: {machine}.\n\n" + "\n".join(rows) + "\n\n" + "; ".join(verdicts) + ". "
        "In a closed loop the latency is the queue (Little's law: clients / throughput), not the service "
        "time (the server's own mean per call, last column). Client and server share the 2 cores with "
        "whatever else runs (load average above).\n\n![latency](affinity_latency.png)\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 200])
    parser.add_argument(
        "--paced-interval-s",
        type=float,
        default=2.0,
        help="also run the most clients paced at one cycle per this many seconds (0: not)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from pyflink_aisp.local import find_free_port

    load = os.getloadavg()
    machine = f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at start, Python {sys.version.split()[0]}"
    with tempfile.TemporaryDirectory(prefix="aisp-affinity-bench-") as tmp:
        port = find_free_port()
        server = _start_server(Path(tmp), port)
        try:
            url = f"http://127.0.0.1:{port}"
            asyncio.run(_phase(url, 4, 1.0))  # warm-up
            results = [asyncio.run(_phase(url, n, args.seconds)) for n in args.clients]
            if args.paced_interval_s:
                results.append(
                    asyncio.run(_phase(url, max(args.clients), args.seconds * 2, args.paced_interval_s))
                )
        finally:
            server.terminate()
            server.wait(timeout=15)
    args.out.mkdir(parents=True, exist_ok=True)
    _plot(results, args.out / "affinity_latency.png")
    slim = [
        {
            k: ({kk: vv for kk, vv in v.items() if kk != "latencies_ms"} if isinstance(v, dict) else v)
            for k, v in r.items()
        }
        for r in results
    ]
    (args.out / "affinity_results.json").write_text(
        json.dumps({"machine": machine, "results": slim}, indent=1)
    )
    section = _section(results, machine)
    replace_section(args.out / "REPORT.md", SECTION, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
