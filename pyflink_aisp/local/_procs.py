"""Process and port helpers for the local stack: pid files, liveness, ports, polling.

Everything here is Linux-first (``/proc``); on other systems liveness falls back
to ``kill(pid, 0)`` and command-line checks are skipped.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pyflink_aisp.errors import EnvironmentSetupError

__all__ = [
    "LOOPBACK",
    "find_free_port",
    "is_alive",
    "launch_detached",
    "pid_matches",
    "port_is_free",
    "port_is_open",
    "read_pid_file",
    "remove_pid_file",
    "tail_text",
    "terminate",
    "wait_until",
    "write_pid_file",
]

LOOPBACK = "127.0.0.1"


def read_pid_file(path: Path) -> list[int]:
    """Read the pids recorded in a pid file (one per line; blank/garbage lines skipped).

    Args:
        path: The pid file; a missing file means no pids.

    Returns:
        The pids in file order.
    """
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return []
    return [int(line) for line in text.split() if line.strip().isdigit() and int(line) > 0]


def write_pid_file(path: Path, pids: Sequence[int]) -> None:
    """Write ``pids`` to ``path`` atomically (temp file + rename).

    Raises:
        ValueError: If a pid is not positive.
    """
    if any(pid <= 0 for pid in pids):
        raise ValueError(f"pids must be positive, got {list(pids)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{pid}\n" for pid in pids), encoding="ascii")
    os.replace(tmp, path)


def remove_pid_file(path: Path) -> None:
    """Delete a pid file if present."""
    path.unlink(missing_ok=True)


# Children started by launch_detached: polled (reaped) by is_alive so that a
# service stopped from the process that started it leaves no zombie. Other
# children of this process are never waited on here (their owners need the status).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def is_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    stat = Path(f"/proc/{pid}/stat")
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def pid_matches(pid: int, marker: str) -> bool:
    """Whether ``pid`` is alive and its command line contains ``marker``.

    Guards against pid reuse: a recorded pid only counts as ours when the
    process still carries the marker (e.g. our config path) in its arguments.
    Where ``/proc`` is unavailable, liveness alone decides.
    """
    if not is_alive(pid):
        return False
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except OSError:
        return False
    return marker in raw.replace(b"\0", b" ").decode("utf-8", "replace")


def wait_until(
    condition: Callable[[], bool],
    timeout_s: float,
    interval_s: float = 0.25,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Poll ``condition`` until it is true or ``timeout_s`` has passed.

    Returns:
        True when the condition held before the deadline, else False.
    """
    deadline = clock() + timeout_s
    while True:
        if condition():
            return True
        remaining = deadline - clock()
        if remaining <= 0:
            return False
        sleep(min(interval_s, remaining))


def terminate(pids: Sequence[int], timeout_s: float = 15.0) -> list[int]:
    """Stop processes: SIGTERM, wait up to ``timeout_s``, then SIGKILL the rest.

    Args:
        pids: Processes to stop (callers pass only pids they recorded).
        timeout_s: Grace period after SIGTERM.

    Returns:
        The pids that had to be SIGKILLed.
    """
    live = [pid for pid in pids if is_alive(pid)]
    for pid in live:
        _signal(pid, signal.SIGTERM)
    if wait_until(lambda: not any(is_alive(p) for p in live), timeout_s, 0.1):
        return []
    killed = [pid for pid in live if is_alive(pid)]
    for pid in killed:
        _signal(pid, signal.SIGKILL)
    wait_until(lambda: not any(is_alive(p) for p in killed), 5.0, 0.05)
    return killed


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could bind ``host:port`` now (SO_REUSEADDR, like the JVM)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def port_is_open(port: int, host: str = LOOPBACK, timeout_s: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def find_free_port(host: str = LOOPBACK) -> int:
    """A port the OS reports free right now (racy by nature; for tests and defaults)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def launch_detached(
    cmd: Sequence[str], *, log_path: Path, cwd: Path, env: dict[str, str] | None = None
) -> int:
    """Start ``cmd`` in its own session with stdout+stderr appended to ``log_path``.

    The child survives this Python process and a terminal's Ctrl-C.

    Returns:
        The child's pid.

    Raises:
        EnvironmentSetupError: If the executable cannot be started.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.Popen(
                list(cmd),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise EnvironmentSetupError(f"cannot start {cmd[0]}: {exc}") from exc
    _CHILDREN[proc.pid] = proc
    return proc.pid


def tail_text(path: Path, max_lines: int = 30) -> str:
    """The last ``max_lines`` lines of a text file ('' if missing)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-max_lines:])
