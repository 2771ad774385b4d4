"""``aisp backfill`` and ``aisp transactions``: commands that run the job or ask its cluster.

``aisp backfill --stream-job NAME [job options]`` re-scores, in BATCH mode,
the range from ``--range-start`` (default earliest) to the offsets of running
streaming job NAME's last completed checkpoint, with the model the job options
name, into ``--output-topic``, and writes its manifest (``--manifest-dir``,
default ``manifests``). It runs in this process (a PyFlink MiniCluster).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from pyflink_aisp.errors import ConfigError, EnvironmentSetupError

__all__ = ["add_alignment_commands"]


def _cmd_backfill(args: argparse.Namespace, rest: list[str]) -> int:
    from pyflink_aisp.pipeline import options_from_args

    argv = list(rest)
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    for refused in ("--mode", "--range-end"):
        if refused in flags:
            raise ConfigError(f"backfill sets {refused} itself (batch, up to the stream's checkpoint)")
    argv += ["--mode", "batch", "--range-end", f"checkpoint:{args.stream_job}"]
    if "--job-name" not in flags:
        argv += ["--job-name", f"{args.stream_job}-backfill"]
    if "--manifest-dir" not in flags:
        argv += ["--manifest-dir", "manifests"]
    options = options_from_args(argv, description="aisp backfill: the job's options")
    from pyflink_aisp.pipeline.flink import run_job

    return run_job(options, prog="aisp backfill")


def _cmd_transactions(args: argparse.Namespace) -> int:
    from pyflink_aisp.kafka import abort_transactions, default_bootstrap_servers, list_transactions
    from pyflink_aisp.pipeline import live_jobs_named

    servers = default_bootstrap_servers(args.bootstrap_servers)
    prefix = args.transactional_id_prefix or args.job_name
    if args.transactions_command == "list":
        rows = list_transactions(servers, prefix)
        for row in rows:
            print(f"{row.transactional_id}\t{row.state}\tproducer {row.producer_id}\t"
                  f"coordinator {row.coordinator}")
        open_count = sum(r.state == "Ongoing" for r in rows)
        print(f"{len(rows)} transactions with prefix {prefix!r}, {open_count} open")
        return 0
    if not args.force:
        rest = args.flink_rest_url or f"http://127.0.0.1:{os.environ.get('AISP_FLINK_REST_PORT', '8081')}"
        try:
            live = live_jobs_named(rest, args.job_name)
        except EnvironmentSetupError as exc:
            raise ConfigError(f"cannot tell whether job {args.job_name!r} is live ({exc}): pass the "
                              "cluster's --flink-rest-url, or --force when it surely is not") from None
        if live:
            raise ConfigError(f"job {args.job_name!r} is {live[0][1]} ({live[0][0]}): aborting its "
                              "transactions would fence its producers; stop it first (or --force)")
    aborted = abort_transactions(servers, prefix)
    print(f"aborted {len(aborted)} open transactions: {', '.join(aborted) or '-'}")
    return 0


def add_alignment_commands(sub: Any) -> None:
    """Add ``backfill`` and ``transactions`` to the ``aisp`` subparsers (``verify`` lives in
    :mod:`pyflink_aisp.cli`)."""
    tx = sub.add_parser("transactions", help="list or abort a job's lingering Kafka transactions (KIP-664)")
    tx.add_argument("transactions_command", choices=["list", "abort"])
    tx.add_argument("--job-name", required=True, help="the job (its transactional id prefix unless given)")
    tx.add_argument("--transactional-id-prefix", default=None)
    tx.add_argument("--bootstrap-servers", default=None,
                    help="default: $AISP_KAFKA_BOOTSTRAP, else 127.0.0.1:$AISP_KAFKA_PORT (9092)")
    tx.add_argument("--flink-rest-url", default=None,
                    help="abort: refuse while a job of that name is live on this cluster "
                         "(default http://127.0.0.1:$AISP_FLINK_REST_PORT, 8081)")
    tx.add_argument("--force", action="store_true", help="abort without asking the cluster")
    tx.set_defaults(func=_cmd_transactions)
    backfill = sub.add_parser(
        "backfill", help="re-score [--range-start, a running stream's last completed checkpoint) in BATCH "
                         "mode into --output-topic, with a manifest; other options as the job's",
        description=__doc__.split("\n\n")[1])
    backfill.add_argument("--stream-job", required=True, help="name of the running streaming job")
    backfill.set_defaults(func=_cmd_backfill, takes_rest=True)
