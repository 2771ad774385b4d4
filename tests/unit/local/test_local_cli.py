"""`aisp local ...` argparse glue (status/down only: no services started)."""

import argparse
import io
import socket

import pytest

from pyflink_aisp.local import add_local_commands


def _parse(*argv):
    parser = argparse.ArgumentParser(prog="aisp")
    add_local_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["local", *argv])


def test_options_parse(tmp_path):
    args = _parse(
        "up",
        "--state-dir",
        str(tmp_path),
        "--kafka-port",
        "19092",
        "--controller-port",
        "19093",
        "--flink-rest-port",
        "18081",
        "--no-flink",
    )
    assert (args.local_command, args.kafka_port, args.kafka_controller_port) == ("up", 19092, 19093)
    assert args.flink_rest_port == 18081 and args.no_flink and callable(args.func)


def test_subcommand_required():
    with pytest.raises(SystemExit):
        _parse()


def test_status_prints_lines(tmp_path):
    args = _parse("status", "--state-dir", str(tmp_path))
    out = io.StringIO()
    assert args.func(args, out) == 0
    assert out.getvalue().splitlines() == ["kafka: stopped", "flink: stopped"]


def test_down_prints_timing(tmp_path):
    args = _parse("down", "--state-dir", str(tmp_path))
    out = io.StringIO()
    assert args.func(args, out) == 0
    assert "down took" in out.getvalue()


def test_taken_port_is_an_error_exit(tmp_path, capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        args = _parse("up", "--state-dir", str(tmp_path), "--kafka-port", str(port), "--no-flink")
        assert args.func(args) == 1
    err = capsys.readouterr().err
    assert f"port {port}" in err and "--kafka-port" in err


def test_env_var_port(tmp_path, monkeypatch):
    monkeypatch.setenv("AISP_KAFKA_PORT", "19555")
    args = _parse("status", "--state-dir", str(tmp_path))
    out = io.StringIO()
    args.func(args, out)
    assert out.getvalue().splitlines()[0] == "kafka: stopped"


def test_flink_passes_the_rest_of_the_line_to_bin_flink(tmp_path):
    args = _parse("flink", "--state-dir", str(tmp_path), "run", "-py", "job.py", "--mode", "batch")
    assert args.flink_args == ["run", "-py", "job.py", "--mode", "batch"]


def test_flink_without_a_running_cluster_says_to_start_it(tmp_path, capsys):
    args = _parse("flink", "--state-dir", str(tmp_path), "list")
    assert args.func(args) == 1
    assert "aisp local up" in capsys.readouterr().err


def test_restart_taskmanager_without_a_cluster_is_one_line(tmp_path, capsys):
    args = _parse("restart-taskmanager", "--state-dir", str(tmp_path))
    out = io.StringIO()
    assert args.func(args, out=out) == 1
    assert out.getvalue() == ""
    assert capsys.readouterr().err == (f"error: no Flink cluster runs from {tmp_path}: start it with "
                                       "`aisp local up`\n")
