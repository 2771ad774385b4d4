"""``aisp affinity serve|topology|leases``: the side service, the host's topology, the leases.

Exit status 0 on success, 1 on a pyflink-aisp error (one line on stderr, printed
by ``aisp``), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_affinity_commands", "format_leases", "format_topology"]

#: Default port of the service (loopback).
DEFAULT_PORT = 7420


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def format_topology(t: Any) -> list[str]:
    """A topology as the lines ``aisp affinity topology`` prints."""
    lines = [f"host {t.host} (source {t.source}): {len(t.gpus)} GPU(s), {len(t.numa_nodes)} NUMA node(s)"]
    for n in t.numa_nodes:
        lines.append(
            f"  numa {n.id}: cpus {_cpulist(n.cpus)}"
            + (f" distances {list(n.distances)}" if n.distances else "")
        )
    for g in t.gpus:
        cur = (
            f", now gen{g.pcie_current_gen} x{g.pcie_current_width}"
            if g.pcie_current_gen and g.pcie_current_width
            else ""
        )
        util = "" if g.utilization_pct is None else f", util {g.utilization_pct}%"
        lines.append(
            f"  gpu {g.index} {g.uuid} {g.name}: {_gib(g.memory_free_bytes)} free of "
            f"{_gib(g.memory_total_bytes)}{util}, pci {g.pci_bus_id} gen{g.pcie_max_gen} "
            f"x{g.pcie_max_width} ({g.link_gbps:.1f} GB/s){cur}, numa {g.numa_node}, cpus "
            f"{_cpulist(t.gpu_cpus(g))}, mig {'on' if g.mig_enabled else 'off'}"
        )
        for m in g.mig_instances:
            lines.append(f"    mig {m.index} {m.uuid}: {_gib(m.memory_total_bytes)}")
        if g.peers:
            lines.append("    peers " + ", ".join(f"{p.uuid} {p.link}" for p in g.peers))
    return lines


def _cpulist(cpus: Any) -> str:
    cpus = sorted(cpus)
    if not cpus:
        return "-"
    runs, start, prev = [], cpus[0], cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        runs.append(f"{start}-{prev}" if prev != start else str(start))
        if c is not None:
            start = prev = c
    return ",".join(runs)


def format_leases(leases: Any) -> list[str]:
    """Leases as the lines ``aisp affinity leases`` prints."""
    lines = [f"{len(leases)} lease(s)"]
    for x in leases:
        lines.append(
            f"  {x.id} {x.state.value:8} {x.job}/{x.operator}/{x.subtask} {x.kind.value} {x.device} "
            f"numa {x.numa_node} cpus {_cpulist(x.cpus)} mem {x.mem_bytes} B ttl {x.ttl_s:g}s"
        )
    return lines


def _cmd_topology(args: argparse.Namespace) -> int:
    from pyflink_aisp.affinity._nvml import discover

    topology = discover(args.topology)
    print(json.dumps(topology.to_dict(), indent=2) if args.json else "\n".join(format_topology(topology)))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from pyflink_aisp.affinity._app import serve
    from pyflink_aisp.affinity._token import resolve_token
    from pyflink_aisp.errors import ConfigError
    from pyflink_aisp.home import aisp_home

    token = None if args.no_auth else resolve_token(args.token_file)
    if token is None and not args.no_auth:
        raise ConfigError(
            "aisp affinity serve needs a token for mutating calls: --token-file FILE, "
            "$AISP_AFFINITY_TOKEN_FILE or $AISP_AFFINITY_TOKEN (or --no-auth)"
        )
    db = args.db or aisp_home() / "affinity" / "leases.db"
    serve(
        db=db,
        topology_file=args.topology,
        host=args.host,
        port=args.port,
        token=token,
        default_ttl_s=args.ttl_s,
    )
    return 0


def _cmd_leases(args: argparse.Namespace) -> int:
    from pyflink_aisp.affinity._client import AffinityClient, ClientConfig

    client = AffinityClient(ClientConfig(url=args.url, retries=1))
    try:
        leases = client.leases(state=args.state, job=args.job)
    finally:
        client.close()
    print(
        json.dumps([x.to_dict() for x in leases], indent=2) if args.json else "\n".join(format_leases(leases))
    )
    return 0


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be a port within 1..65535, got {text}")
    return value


def add_affinity_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``affinity serve|topology|leases`` to an argparse subparsers object (each sets ``func``)."""
    parser = subparsers.add_parser("affinity", help="GPU affinity side service (NVML topology, leases)")
    sub = parser.add_subparsers(dest="affinity_command", required=True)
    topo = sub.add_parser("topology", help="print this host's GPUs / MIG instances / NUMA nodes")
    topo.add_argument(
        "--topology", type=Path, default=None, help="a topology file (JSON or YAML) instead of NVML"
    )
    topo.add_argument("--json", action="store_true",
                      help="print the topology as JSON, in the topology file's schema "
                           "(a file for --topology)")
    topo.set_defaults(func=_cmd_topology)

    serve = sub.add_parser("serve", help="run the lease service (HTTP/JSON, OpenAPI at /docs)")
    serve.add_argument("--topology", type=Path, default=None, help="a topology file instead of NVML")
    serve.add_argument(
        "--db", type=Path, default=None, help="SQLite lease file (default $AISP_HOME/affinity/leases.db)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    serve.add_argument("--port", type=_port, default=DEFAULT_PORT)
    serve.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="bearer token file (else $AISP_AFFINITY_TOKEN_FILE / $AISP_AFFINITY_TOKEN)",
    )
    serve.add_argument("--no-auth", action="store_true", help="mutating calls need no token")
    serve.add_argument("--ttl-s", type=_positive_float, default=30.0, help="default lease TTL, s")
    serve.set_defaults(func=_cmd_serve)

    leases = sub.add_parser("leases", help="list the service's leases")
    leases.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}")
    leases.add_argument("--state", choices=["active", "released", "expired"], default=None)
    leases.add_argument("--job", default=None)
    leases.add_argument("--json", action="store_true")
    leases.set_defaults(func=_cmd_leases)
    return parser
