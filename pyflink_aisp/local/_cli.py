"""``aisp local up|down|status``: argparse glue for the local dev stack."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from pyflink_aisp.errors import AispError
from pyflink_aisp.jars import JarKind, ensure_jars
from pyflink_aisp.local._flink_config import MAX_TASKMANAGERS, pyflink_home
from pyflink_aisp.local._stack import ENV_VARS, LocalStack, LocalStackConfig

__all__ = ["add_local_commands", "run_jars_command", "run_local_command"]


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir", type=Path, default=None,
        help=f"stack state folder (env {ENV_VARS['state_dir']}; default <aisp_home>/local)",
    )  # fmt: skip
    parser.add_argument(
        "--kafka-port", type=int, default=None,
        help=f"Kafka broker port on 127.0.0.1 (env {ENV_VARS['kafka_port']}; default 9092)",
    )  # fmt: skip
    parser.add_argument(
        "--controller-port", type=int, default=None, dest="kafka_controller_port",
        help=f"KRaft controller port (env {ENV_VARS['kafka_controller_port']}; default 9093)",
    )  # fmt: skip
    parser.add_argument(
        "--flink-rest-port", type=int, default=None,
        help=f"Flink REST/web UI port (env {ENV_VARS['flink_rest_port']}; default 8081)",
    )  # fmt: skip
    parser.add_argument("--no-flink", action="store_true", help="only the Kafka broker (no Flink cluster)")
    parser.add_argument(
        "--prometheus-port", type=int, default=None,
        help=f"enable Flink's Prometheus metrics reporter on ports N (JobManager) and N+1 (TaskManager) "
        f"(env {ENV_VARS['prometheus_port']}; default off)",
    )  # fmt: skip
    parser.add_argument(
        "--taskmanagers", type=_taskmanagers, default=None, dest="flink_taskmanagers",
        help=f"Flink TaskManagers to start, each a JVM with 4 slots "
             f"(env {ENV_VARS['flink_taskmanagers']}; default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--isolated-python", action="store_true",
        help="start the Flink daemons without this venv (PATH, PYTHONPATH, python.executable): "
             "jobs must ship their Python environment (`aisp package`)",
    )  # fmt: skip


def _taskmanagers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_TASKMANAGERS:
        raise argparse.ArgumentTypeError(f"must be an integer in 1..{MAX_TASKMANAGERS}, got {text!r}")
    return value


def add_local_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``local up|down|status|jars`` to an argparse subparsers object.

    Each leaf parser sets ``func``: call ``args.func(args)``, which prints status
    lines (``kafka: running pid 1234 bootstrap 127.0.0.1:9092``) and returns the
    exit code (0 ok, 1 on an :class:`~pyflink_aisp.errors.AispError`, printed to stderr).

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The ``local`` parser.
    """
    local = subparsers.add_parser(
        "local", help="embedded dev stack: Kafka (KRaft) broker + Flink standalone cluster"
    )
    actions = local.add_subparsers(
        dest="local_command", metavar="{up,down,status,restart-taskmanager,jars,flink}"
    )
    actions.required = True
    helps = {
        "up": "start the broker (and Flink) unless running; wait until they answer",
        "down": "stop what `up` started in the state folder",
        "status": "show what runs",
        "restart-taskmanager": "start the TaskManagers that are gone beside the running JobManager "
        "(after reaping the Python workers dead TaskManagers left)",
    }
    for name, text in helps.items():
        parser = actions.add_parser(name, help=text, description=text)
        _add_options(parser)
        parser.set_defaults(func=run_local_command)
    jars = actions.add_parser(
        "jars", help="resolve the broker and connector jars into the cache (Maven Central)"
    )
    jars.set_defaults(func=run_jars_command)
    flink = actions.add_parser(
        "flink",
        help="PyFlink's bin/flink aimed at the local cluster: run, list, stop, cancel, savepoint",
        description="Runs PyFlink's bin/flink with FLINK_CONF_DIR of the local stack, e.g. "
        "`aisp local flink run -py jobs/review_sentiment.py --input-topic t --output-topic o`, "
        "`aisp local flink list`, `aisp local flink stop JOB_ID` (stop with a savepoint).",
    )
    flink.add_argument("--state-dir", type=Path, default=None, help=argparse.SUPPRESS)
    flink.add_argument("flink_args", nargs=argparse.REMAINDER, help="arguments of bin/flink")
    flink.set_defaults(func=run_flink_command)
    return local


def run_flink_command(args: argparse.Namespace) -> int:
    """Run ``bin/flink ARGS`` with the local stack's environment; returns its exit code."""
    try:
        stack = LocalStack(LocalStackConfig.from_env(state_dir=args.state_dir))
        running = stack.status().flink.running
        env = stack.flink_env()
    except AispError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not running:
        print("error: the local Flink cluster is not running: start it with `aisp local up`", file=sys.stderr)
        return 1
    return subprocess.call([str(pyflink_home() / "bin" / "flink"), *args.flink_args], env=env)


def run_jars_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Fill the jar cache (both kinds) and print one line per kind.

    Returns:
        Exit code: 0 on success, 1 on an AispError (printed to stderr).
    """
    out = out or sys.stdout
    for kind in JarKind:
        try:
            jars = ensure_jars(kind)
        except AispError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{kind.value}: {len(jars)} jars in {jars[0].parent}", file=out)
    return 0


def run_local_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``args.local_command`` (``up``/``down``/``status``) and print the status lines.

    Returns:
        Exit code: 0 on success (``status``: also when stopped), 1 on an AispError.
    """
    out = out or sys.stdout
    try:
        config = LocalStackConfig.from_env(
            state_dir=args.state_dir,
            kafka_port=args.kafka_port,
            kafka_controller_port=args.kafka_controller_port,
            flink_rest_port=args.flink_rest_port,
            with_flink=False if args.no_flink else None,
            prometheus_port=getattr(args, "prometheus_port", None),
            flink_taskmanagers=getattr(args, "flink_taskmanagers", None),  # older callers' Namespaces
            flink_isolated_python=True if getattr(args, "isolated_python", False) else None,
        )
        stack = LocalStack(config)
        started = time.monotonic()
        action = {"up": stack.up, "down": stack.down, "status": stack.status,
                  "restart-taskmanager": stack.restart_taskmanager}  # fmt: skip
        status = action[args.local_command]()
    except AispError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in status.lines():
        print(line, file=out)
    if args.local_command != "status":
        print(f"({args.local_command} took {time.monotonic() - started:.1f} s; "
              f"state in {status.state_dir})", file=out)  # fmt: skip
    return 0
