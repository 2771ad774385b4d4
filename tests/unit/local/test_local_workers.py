"""Finding and reaping PyFlink Python workers by their marker, with real processes.

A real worker needs a TaskManager (tests/e2e/test_failures.py kills real ones);
here real child processes carry the same two marks a worker has (a worker
module in the command line, the cluster's FLINK_CONF_DIR in the environment).
"""

import os
import subprocess
import sys
import time

import psutil
import pytest

from pyflink_aisp.local import orphaned_workers, python_workers, reap_processes

IGNORE_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "print('ready', flush=True); time.sleep(120)")


def _spawn(conf_dir, *, marker="pyflink.fn_execution.beam.beam_boot", code="import time; time.sleep(120)"):
    env = {**os.environ, "FLINK_CONF_DIR": str(conf_dir)}
    proc = subprocess.Popen([sys.executable, "-c", code, marker], env=env, stdout=subprocess.PIPE, text=True)
    return proc


@pytest.fixture
def spawned():
    procs = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_workers_are_found_by_conf_dir_and_command_line(tmp_path, spawned):
    ours, theirs = tmp_path / "a" / "conf", tmp_path / "b" / "conf"
    spawned += [_spawn(ours), _spawn(ours, marker="pyflink-udf-runner.sh"), _spawn(theirs),
                _spawn(ours, marker="not-a-worker")]
    found = [p.pid for p in python_workers(ours)]
    assert found == sorted([spawned[0].pid, spawned[1].pid])
    assert [p.pid for p in python_workers(theirs)] == [spawned[2].pid]


def test_a_worker_under_a_live_taskmanager_is_no_orphan(tmp_path, spawned):
    conf = tmp_path / "conf"
    spawned.append(_spawn(conf))
    assert orphaned_workers(conf, [os.getpid()]) == []  # this process plays its TaskManager (parent)
    assert [p.pid for p in orphaned_workers(conf, [])] == [spawned[0].pid]
    assert [p.pid for p in orphaned_workers(conf, [spawned[0].pid + 10_000_000])] == [spawned[0].pid]


def test_reap_terminates_and_kills_one_that_ignores_sigterm(tmp_path, spawned, caplog):
    conf = tmp_path / "conf"
    spawned += [_spawn(conf), _spawn(conf, code=IGNORE_TERM)]
    assert spawned[1].stdout.readline().strip() == "ready"  # its SIGTERM handler is set
    with caplog.at_level("WARNING"):
        reaped = reap_processes(python_workers(conf), grace_s=1.0)
    assert reaped == sorted(p.pid for p in spawned)
    assert not any(psutil.pid_exists(p.pid) and psutil.Process(p.pid).status() != "zombie" for p in spawned)
    assert f"Python workers [{spawned[1].pid}] ignored SIGTERM for 1 s; killed" in caplog.text
    assert python_workers(conf) == []
    assert reap_processes([]) == []


def test_reap_skips_a_process_that_is_gone(tmp_path, spawned):
    spawned.append(_spawn(tmp_path / "conf"))
    proc = psutil.Process(spawned[0].pid)
    spawned[0].kill()
    spawned[0].wait()
    assert reap_processes([proc], grace_s=0.5) == []


def test_a_workers_taskmanager_is_its_nearest_listed_ancestor(tmp_path, spawned):
    """kill_taskmanager(busy_only=True) kills the TaskManager a worker descends from (here: this
    process plays the TaskManager, the worker its grandchild through a shell as PyFlink's runner)."""
    from pyflink_aisp.chaos._kill import _ancestor

    shell = subprocess.Popen(["bash", "-c", f"{sys.executable} -c 'import time; time.sleep(120)'; :"])
    spawned.append(shell)
    for _ in range(200):
        children = psutil.Process(shell.pid).children()
        if children:
            break
        time.sleep(0.02)
    worker = children[0].pid
    assert _ancestor(worker, {os.getpid(), 1}) == os.getpid()  # the nearest listed one
    assert _ancestor(worker, {shell.pid, os.getpid()}) == shell.pid
    assert _ancestor(worker, {worker + 10_000_000}) is None
    children[0].kill()
    children[0].wait(5)
    assert _ancestor(worker, {os.getpid()}) is None  # gone
