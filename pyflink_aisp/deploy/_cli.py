"""``aisp package`` and ``aisp sql``: argparse glue for :mod:`pyflink_aisp.deploy`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_deploy_commands"]


def _cmd_package(args: argparse.Namespace) -> int:
    from pyflink_aisp.deploy._package import build_package
    from pyflink_aisp.local import LocalStack, LocalStackConfig, pyflink_home

    jobmanager = args.jobmanager
    if jobmanager is None:
        config = LocalStack(LocalStackConfig.from_env(state_dir=args.state_dir)).flink_config()
        jobmanager = f"localhost:{config.rest_port}"
    flink = args.flink or str(pyflink_home() / "bin" / "flink")
    package = build_package(args.out, flink=flink, jobmanager=jobmanager)
    env = package.env
    print(f"package {package.directory}")
    print(f"  python env {env.path.name}: {env.size_bytes / 1e6:.0f} MB, "
          f"{'built' if env.built else 'from the cache'} (key {env.key[:16]})")
    print(f"  model {package.model.directory} sha256 {package.model.sha256} (checked by each worker at load)")
    print(f"  jars {' '.join(j.name for j in package.jars)}")
    print("run it (add job flags as needed; see jobs/review_sentiment.py --help):")
    print(package.command_line("--input-topic", args.input_topic, "--output-topic", args.output_topic))
    return 0


def _cmd_sql(args: argparse.Namespace) -> int:
    from pyflink_aisp.deploy._sql import run_sql
    from pyflink_aisp.local import LocalStack, LocalStackConfig

    stack = LocalStack(LocalStackConfig.from_env(state_dir=args.state_dir))
    extra = [item for pair in (("-D", d) for d in args.define) for item in pair]
    result = run_sql(stack, args.file, extra_args=extra, models=args.models)
    if args.file is None:
        return result.returncode
    for job_id in result.job_ids:
        print(f"aisp sql: submitted job {job_id} (stop it with `aisp local flink stop {job_id}`)")
    if not result.ok:
        why = result.error or f"the SQL client exited {result.returncode}"
        print(f"aisp sql: error: {args.file}: {why}", file=sys.stderr)
        return 1
    return 0


def add_deploy_commands(subparsers: Any) -> None:
    """Add ``package`` and ``sql`` to the ``aisp`` subparsers (each sets ``func``)."""
    package = subparsers.add_parser(
        "package", help="build what `flink run` needs on a cluster without the project venv; print the line",
        description="Writes the job's Python environment archive (-pyarch), the connector jar, the model "
        "and the entry point into one folder and prints the exact `flink run` line.",
    )  # fmt: skip
    package.add_argument("--out", type=Path, default=None,
                         help="package folder (default <aisp_home>/packages/review-sentiment)")
    package.add_argument("--jobmanager", default=None,
                         help="flink run -m HOST:PORT (default: the local stack's localhost:REST_PORT)")
    package.add_argument("--flink", default=None, help="flink executable in the printed line "
                                                       "(default: PyFlink's bin/flink)")
    package.add_argument("--input-topic", default="reviews", help="input topic in the printed line")
    package.add_argument("--output-topic", default="scores", help="output topic in the printed line")
    package.add_argument("--state-dir", type=Path, default=None, help=argparse.SUPPRESS)
    package.set_defaults(func=_cmd_package)

    sql = subparsers.add_parser(
        "sql", help="run a Flink SQL file on the local cluster (no FILE: interactive SQL client)",
        description="Flink's SQL client against the local cluster with the Kafka connector, flink-python "
        "and SQL gateway jars and this venv's Python for the UDF workers: "
        f"e.g. `aisp sql {shlex.quote('jobs/sql/review_sentiment.sql')}`. Prints each submitted job id.",
    )  # fmt: skip
    sql.add_argument("file", nargs="?", type=Path, default=None, help="SQL script (-f); none: interactive")
    sql.add_argument("-D", dest="define", action="append", default=[], metavar="KEY=VALUE",
                     help="Flink configuration for the session (repeatable)")
    sql.add_argument("--models", type=Path, default=None, metavar="FILE",
                     help="a model registry (YAML): each model NAME is the SQL function "
                          "'pyflink_aisp.pipeline.registry.NAME' (checked before the client starts)")
    sql.add_argument("--state-dir", type=Path, default=None, help=argparse.SUPPRESS)
    sql.set_defaults(func=_cmd_sql)
