"""A real affinity service: ``aisp affinity serve`` as a uvicorn subprocess on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "affinity"
TOKEN = "s3cret-test-token"


@dataclass
class Service:
    """One server process over a lease file; ``restart`` reuses port and file."""

    topology: Path
    db: Path
    log: Path
    port: int
    ttl_s: float = 30.0
    token: str | None = TOKEN
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Service:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("AISP_AFFINITY_TOKEN_FILE", None)
        args = [
            sys.executable,
            "-m",
            "pyflink_aisp.cli",
            "affinity",
            "serve",
            "--topology",
            str(self.topology),
            "--db",
            str(self.db),
            "--port",
            str(self.port),
            "--ttl-s",
            str(self.ttl_s),
        ]
        if self.token is None:
            args.append("--no-auth")
        else:
            env["AISP_AFFINITY_TOKEN"] = self.token
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"affinity server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"affinity server did not answer in 60 s: {self.log.read_text()}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


@pytest.fixture
def affinity_service(tmp_path: Path) -> Iterator:
    """Factory: ``affinity_service("numa2x4.yaml", ttl_s=30)`` → a started :class:`Service`."""
    from pyflink_aisp.local import find_free_port

    started: list[Service] = []

    def start(topology: str | Path = "numa2x4.yaml", **kw) -> Service:
        path = topology if isinstance(topology, Path) else DATA / topology
        n = len(started)
        service = Service(
            topology=path,
            db=tmp_path / f"leases{n}.db",
            log=tmp_path / f"server{n}.log",
            port=find_free_port(),
            **kw,
        )
        started.append(service)
        return service.start()

    yield start
    for service in started:
        service.stop()


def settled(read, done, timeout_s: float = 60.0):
    """``read()`` once ``done(value)`` holds (or at the deadline): PyFlink may finish a
    function's ``close()`` just after the job's result is in (see _sql_functions)."""
    import time

    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
    return value


def check_numa_spread(leases, nodes) -> None:
    """Two CPU leases on a 2-node host: on both nodes when held at once, else each on the best one."""
    if len(nodes) == 2:
        a, b = leases
        if a.acquired_at < b.released_at and b.acquired_at < a.released_at:  # held at once: spread
            assert sorted(x.cpus for x in leases) == sorted(tuple(n) for n in nodes)
        else:  # one after the other (BATCH may run the subtasks apart): each got the best node
            assert [x.cpus for x in leases] == [tuple(nodes[0])] * 2


@pytest.fixture
def affinity_checks():
    """``(settled, check_numa_spread)`` for the job tests (test modules cannot import conftest)."""
    return settled, check_numa_spread
