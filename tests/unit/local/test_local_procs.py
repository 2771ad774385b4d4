"""Pid files, liveness, ports, polling and termination helpers."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from pyflink_aisp.local._procs import (
    LOOPBACK,
    args_adjacent,
    command_line,
    describe_command,
    ephemeral_port_range,
    find_free_port,
    find_pids,
    is_alive,
    pid_matches,
    port_holders,
    port_is_free,
    port_is_open,
    port_taken_error,
    read_pid_file,
    tail_text,
    terminate,
    wait_until,
    write_pid_file,
)


def _sleeper(*extra_args, ignore_term=False):
    code = "import signal, sys, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code, *extra_args], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"  # handler installed before we signal
    return proc


def test_pid_file_roundtrip(tmp_path):
    path = tmp_path / "sub" / "x.pid"
    assert read_pid_file(path) == []
    write_pid_file(path, [12, 34])
    assert read_pid_file(path) == [12, 34]
    path.write_text("56\ngarbage\n\n-3\n")
    assert read_pid_file(path) == [56]
    with pytest.raises(ValueError):
        write_pid_file(path, [0])


def test_is_alive_self_and_finished_child():
    assert is_alive(os.getpid())
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not is_alive(proc.pid)


def test_unreaped_child_counts_as_dead():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_until(lambda: not is_alive(proc.pid), 10, 0.05)  # zombie or reaped: dead either way


def test_pid_matches_checks_command_line(tmp_path):
    marker = str(tmp_path / "server.properties")
    proc = _sleeper(marker)
    try:
        assert pid_matches(proc.pid, marker)
        assert not pid_matches(proc.pid, str(tmp_path / "other"))
        assert not pid_matches(os.getpid(), marker)
    finally:
        proc.kill()
        proc.wait()
    assert not pid_matches(proc.pid, marker)



def test_pid_matches_a_process_inside_execve(tmp_path):
    """A bash that execs its command reads an empty command line for a moment in between
    (the CI failure: a just-started TaskManager counted as gone); it still matches."""
    marker = str(tmp_path / "conf")
    command = f"exec {sys.executable} -c 'import time; time.sleep(30)' {marker}"
    for _ in range(10):
        proc = subprocess.Popen(["bash", "-c", command])
        try:
            reads = [pid_matches(proc.pid, marker) for _ in range(2000)]  # before, during and after exec
            assert all(reads), f"{reads.count(False)} of {len(reads)} reads missed it"
        finally:
            proc.kill()
            proc.wait()

def test_terminate_graceful():
    proc = _sleeper()
    assert terminate([proc.pid], timeout_s=10) == []
    assert proc.wait(5) == -signal.SIGTERM


def test_terminate_escalates_to_sigkill():
    proc = _sleeper(ignore_term=True)
    assert terminate([proc.pid], timeout_s=0.3) == [proc.pid]
    assert proc.wait(5) == -signal.SIGKILL


def test_terminate_ignores_dead_pids():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert terminate([proc.pid], timeout_s=1) == []


def test_port_checks_with_a_bound_socket():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert not port_is_free(port)  # bound, not listening: still taken
        assert not port_is_open(port)
        sock.listen()
        assert not port_is_free(port)
        assert port_is_open(port)
    assert port_is_free(port)


def test_find_free_port_is_free():
    port = find_free_port()
    assert 1024 < port < 65536
    assert port_is_free(port)


def test_find_free_port_avoids_the_ephemeral_range_for_every_port_of_its_span():
    for _ in range(200):
        port = find_free_port(span=2, ephemeral=(20_000, 60_999))
        assert (10_000 <= port and port + 1 < 20_000) or (port > 60_999 and port + 1 <= 65_535), port
        assert port_is_free(port) and port_is_free(port + 1)


def test_find_free_port_skips_ports_in_use():
    port = find_free_port(span=2)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, port))
        sock.listen()
        # the only candidates left: `port` (in use) and `port + 1`
        for _ in range(20):
            assert find_free_port(lowest=port, ephemeral=(port + 2, 65_535)) == port + 1


def test_find_free_port_span_must_be_positive():
    with pytest.raises(ValueError, match="span must be >= 1, got 0"):
        find_free_port(span=0)


def test_the_ephemeral_range_is_read_from_the_sysctl_file(tmp_path):
    good, bad, odd = tmp_path / "good", tmp_path / "bad", tmp_path / "odd"
    good.write_text("32768\t60999\n")
    bad.write_text("not numbers\n")
    odd.write_text("61000 32768\n")
    assert ephemeral_port_range(good) == (32768, 60999)
    assert ephemeral_port_range(bad) is None
    assert ephemeral_port_range(odd) is None
    assert ephemeral_port_range(tmp_path / "missing") is None


def test_wait_until_uses_injected_clock():
    now = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    assert not wait_until(lambda: False, 1.0, 0.3, clock=lambda: now[0], sleep=sleep)
    assert sum(sleeps) == pytest.approx(1.0)
    calls = iter([False, False, True])
    assert wait_until(lambda: next(calls), 10.0, 1.0, clock=lambda: now[0], sleep=sleep)


def test_tail_text(tmp_path):
    path = tmp_path / "log"
    path.write_text("".join(f"line{i}\n" for i in range(100)))
    assert tail_text(path, 2) == "line98\nline99"
    assert tail_text(tmp_path / "missing") == ""


def test_port_holders_names_the_listening_process(tmp_path):
    code = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    code += "print(s.getsockname()[1], flush=True); time.sleep(60)"
    props = str(tmp_path / "server.properties")
    argv = [sys.executable, "-c", code, "-cp", "a.jar:b.jar", "kafka.Kafka", props]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        port = int(proc.stdout.readline())
        assert port_holders(port) == [proc.pid]
        msg = str(port_taken_error(port, "a broker started from /new", "choose another with --kafka-port"))
        name = os.path.basename(sys.executable)
        assert f"port {port} on 127.0.0.1 is taken by pid {proc.pid} ({name} … kafka.Kafka " in msg
        assert props in msg and "a.jar" not in msg
        assert f"not by a broker started from /new; stop it with `kill {proc.pid}` or choose another" in msg
    finally:
        proc.kill()
        proc.wait()
    assert port_holders(port) == []


def test_port_holders_of_a_listening_socket_in_this_process():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert port_holders(sock.getsockname()[1]) == [os.getpid()]


def test_port_taken_error_when_the_holder_is_not_visible(monkeypatch):
    import pyflink_aisp.local._procs as procs

    monkeypatch.setattr(procs, "port_holders", lambda port: [])
    msg = str(procs.port_taken_error(4242, "ours", "hint"))
    assert "taken by another process" in msg and "ss -tanp 'sport = :4242'" in msg and msg.endswith("; hint")


def test_describe_command_shortens_java_command_lines():
    kafka = ["/usr/bin/java", "-Xmx512m", "-Dx=1", "-cp", "a.jar:b.jar", "kafka.Kafka", "/s/x.properties"]
    assert describe_command(kafka) == "java … kafka.Kafka /s/x.properties"
    flink = ["java", "-Xmx1", "-classpath", "lib/*", "org.x.Entrypoint", "-D", "a=b", "--configDir", "/c"]
    assert describe_command(flink) == "java … org.x.Entrypoint --configDir /c"
    assert describe_command(["sleep", "60"]) == "sleep 60"
    assert describe_command(["x" * 300], max_chars=10) == "x" * 9 + "…"
    assert describe_command([]) == "?"


def test_find_pids_by_adjacent_arguments(tmp_path):
    marker = str(tmp_path / "server.properties")
    proc = _sleeper("kafka.Kafka", marker)
    decoy = _sleeper(marker, "kafka.Kafka")  # both strings, wrong order
    try:
        assert command_line(proc.pid)[-2:] == ["kafka.Kafka", marker]
        assert find_pids(lambda args: args_adjacent(args, "kafka.Kafka", marker)) == [proc.pid]
    finally:
        for p in (proc, decoy):
            p.kill()
            p.wait()
    assert find_pids(lambda args: args_adjacent(args, "kafka.Kafka", marker)) == []
    assert command_line(proc.pid) is None


def test_a_stack_config_on_free_ports_takes_four_distinct_free_ones(tmp_path):
    from pyflink_aisp.local import LocalStackConfig

    config = LocalStackConfig.on_free_ports(tmp_path, flink_taskmanagers=2)
    ports = [config.kafka_port, config.kafka_controller_port, config.flink_rest_port, config.flink_rpc_port]
    assert len(set(ports)) == 4 and all(port_is_free(p) for p in ports)
    assert config.flink_taskmanagers == 2 and config.state_dir == tmp_path


@pytest.mark.parametrize("pid", [0, -1, -os.getpgid(0), 2**31, 2**63])
def test_a_number_that_is_no_pid_is_not_alive_and_has_no_command_line(tmp_path, pid):
    """Never a process group (kill(0 or -N, 0)) nor an OverflowError: read_pid_file takes any
    positive number a damaged pid file holds."""
    assert not is_alive(pid)
    assert not pid_matches(pid, "x")
    assert command_line(pid) is None
    (tmp_path / "big.pid").write_text(f"{2**63}\n")
    assert not [p for p in read_pid_file(tmp_path / "big.pid") if is_alive(p)]
