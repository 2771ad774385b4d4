"""Fakes for the local-stack unit tests: a taken port, and processes that look like services.

A "fake broker" / "fake daemon" is a sleeping Python process whose command line
carries the markers the real one would (e.g. the state dir's server.properties).
"""

import socket
import subprocess
import sys

import pytest


@pytest.fixture
def listening():
    """A port some other program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def fake_process():
    """Start ``python -c <sleep> *marker``; killed at teardown. ``listen=True``: it also
    listens on a free loopback port, returned as ``proc.port``."""
    procs = []

    def start(*marker, listen=False):
        code = (
            "import socket, sys, time\n"
            "port = 0\n"
            "if sys.argv[1] == 'listen':\n"
            "    s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); port = s.getsockname()[1]\n"
            "print(port, flush=True)\n"
            "time.sleep(60)\n"
        )
        args = [sys.executable, "-c", code, "listen" if listen else "-", *marker]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE)
        procs.append(proc)
        proc.port = int(proc.stdout.readline())  # exec'ed: /proc cmdline now shows the marker
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
