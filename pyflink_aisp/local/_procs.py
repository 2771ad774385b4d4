"""Process and port helpers for the local stack: pid files, liveness, ports, polling.

Process inspection goes through psutil (liveness, command lines, listening sockets);
the ephemeral port range is read from Linux's ``/proc/sys/net/ipv4/ip_local_port_range``.
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from pyflink_aisp.errors import EnvironmentSetupError

__all__ = [
    "LOOPBACK",
    "args_adjacent",
    "command_line",
    "describe_command",
    "ephemeral_port_range",
    "find_free_port",
    "find_pids",
    "is_alive",
    "launch_detached",
    "pid_matches",
    "port_holders",
    "port_is_free",
    "port_is_open",
    "port_taken_error",
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


#: Pids are positive C ints (``pid_t``): 0 and -N name process groups to kill(2), larger ones overflow it.
_PID_LIMIT = 2**31


def is_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (False for a number that is no pid)."""
    if not 0 < pid < _PID_LIMIT:
        return False
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
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # exists, not ours to inspect


_EXEC_RETRIES = 20


def pid_matches(pid: int, marker: str) -> bool:
    """Whether ``pid`` is alive and its command line contains ``marker``.

    Guards against pid reuse: a recorded pid only counts as ours when the
    process still carries the marker (e.g. our config path) in its arguments.
    Where its command line cannot be read, liveness alone decides. A live process's
    command line reads empty while it is inside ``execve()`` (measured here: 30
    empty reads of running processes over 30 bash subshells exec'ing java); such a
    read is retried for up to ~0.2 s before the process counts as not ours.
    """
    args: list[str] = []
    for _ in range(_EXEC_RETRIES):
        if not is_alive(pid):
            return False
        try:
            args = psutil.Process(pid).cmdline()
        except psutil.NoSuchProcess:
            return False
        except psutil.Error:
            return True  # not ours to read: liveness decides
        if args:
            break
        time.sleep(0.01)  # empty while the process is inside execve() (a daemon script exec'ing java)
    return marker in " ".join(args)


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


#: Where Linux keeps its ephemeral port range (``ip_local_port_range``, Linux
#: Documentation/networking/ip-sysctl.rst): the ports it hands out to outgoing
#: connections and to listeners on port 0.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Lowest port :func:`find_free_port` picks (above most registered service ports).
_LOWEST_PICK = 10_000


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The OS's ephemeral port range ``(first, last)``, inclusive; None where unknown
    (not Linux, or the file unreadable or malformed)."""
    try:
        first, last = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return None
    return (first, last) if 0 < first <= last <= 65535 else None


def find_free_port(host: str = LOOPBACK, *, span: int = 1,
                   ephemeral: tuple[int, int] | bool | None = True, lowest: int = _LOWEST_PICK) -> int:
    """A port P such that ``P .. P + span - 1`` are free right now and, where the OS's
    ephemeral range is known, outside it (for tests, benchmarks and defaults).

    Choosing a free port is racy by nature: until the daemon binds it, anything may
    take it. Ports in the ephemeral range are the ones the kernel itself hands to every
    outgoing connection and port-0 listener (a broker's clients, a JVM's RPC and blob
    servers), so a port picked there can be taken within seconds by an unrelated
    socket: a landing CI run lost a TaskManager's Prometheus port that way. So P is
    drawn at random from ``[lowest, first)`` and ``(last, 65535]`` of that range.

    Args:
        host: Address the ports must be free on.
        span: How many consecutive ports must be free (≥ 1).
        ephemeral: The range to avoid: True reads :func:`ephemeral_port_range`;
            an explicit ``(first, last)``; None or False avoids nothing.
        lowest: Lowest port drawn (default 10000, above most registered services).

    Returns:
        P; where no range is known or none of 1,000 draws is free, a port the OS
        chooses (port 0) whose span is free.

    Raises:
        ValueError: ``span`` < 1.
    """
    if span < 1:
        raise ValueError(f"span must be >= 1, got {span}")
    avoid = ephemeral_port_range() if ephemeral is True else (ephemeral or None)
    if avoid is not None:
        first, last = avoid
        candidates = [r for r in (range(lowest, first - span + 1), range(last + 1, 65536 - span + 1))
                      if len(r) > 0]
        rng = random.SystemRandom()
        for _ in range(1000 if candidates else 0):
            port = rng.choice(rng.choice(candidates))
            if all(port_is_free(port + i, host) for i in range(span)):
                return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port + span <= 65536 and all(port_is_free(port + i, host) for i in range(1, span)):
            return port


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


def command_line(pid: int) -> list[str] | None:
    """The arguments of process ``pid`` (psutil); None if unreadable, gone, empty or no pid."""
    if not 0 < pid < _PID_LIMIT:
        return None
    try:
        return psutil.Process(pid).cmdline() or None
    except psutil.Error:
        return None


def args_adjacent(args: Sequence[str], first: str, second: str) -> bool:
    """Whether ``first`` is directly followed by ``second`` in ``args`` (e.g. ``--configDir DIR``)."""
    return any(a == first and b == second for a, b in itertools.pairwise(args))


def find_pids(match: Callable[[list[str]], bool]) -> list[int]:
    """Live processes (readable by this user) whose argument list satisfies ``match``, by pid.

    Used to find a service's processes by the state-folder paths in their command
    line when its pid file is gone.
    """
    found = []
    own = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        pid, args = proc.info["pid"], proc.info["cmdline"]
        if pid != own and args and match(args) and is_alive(pid):
            found.append(pid)
    return sorted(found)


def port_holders(port: int) -> list[int]:
    """Pids with a socket listening on TCP ``port`` (any address), via psutil.

    Only processes whose sockets this user may see are named (as root: all).
    """
    try:
        listening = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return []
    return sorted({c.pid for c in listening
                   if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid})


def describe_command(args: Sequence[str], max_chars: int = 200) -> str:
    """A short form of a command line: for java, ``java … <main class> <args>`` without -D options."""
    if not args:
        return "?"
    short = list(args)
    for flag in ("-cp", "-classpath", "--class-path"):
        if flag in args[:-1]:
            rest = list(args[args.index(flag) + 2 :])
            kept, skip = [], False
            for arg in rest:
                if not skip and not arg.startswith("-D"):
                    kept.append(arg)
                skip = arg == "-D"
            short = [Path(args[0]).name, "…", *kept]
            break
    text = " ".join(short)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def port_taken_error(port: int, ours: str, hint: str) -> EnvironmentSetupError:
    """The error for a taken ``port``, naming the holders (:func:`port_holders`).

    Args:
        port: The TCP port on :data:`LOOPBACK`.
        ours: What would have been fine there, e.g. ``a broker started from /x``.
        hint: How to choose another port.

    Returns:
        E.g. ``port 9092 on 127.0.0.1 is taken by pid 1234 (java … kafka.Kafka
        /old/kafka/server.properties), not by a broker started from /new; stop it
        with `kill 1234` or choose another with ...``.
    """
    holders = port_holders(port)
    if holders:
        who = ", ".join(f"pid {pid} ({describe_command(command_line(pid) or [])})" for pid in holders)
        them = "it" if len(holders) == 1 else "them"
        stop = f"stop {them} with `kill {' '.join(map(str, holders))}` or "
    else:
        who = f"another process (pid not visible here; `ss -tanp 'sport = :{port}'` may name it)"
        stop = ""
    return EnvironmentSetupError(f"port {port} on {LOOPBACK} is taken by {who}, not by {ours}; {stop}{hint}")
