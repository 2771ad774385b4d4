"""Start the KServe ModelServer of ``kserve_onnx.py`` from the venv of ``make servers`` on free
loopback ports (the tests' ``v2_server`` fixture and ``bench/remote_bench.py`` use it)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from pyflink_aisp.home import aisp_home
from pyflink_aisp.local import find_free_port

HERE = Path(__file__).resolve().parent


def kserve_python() -> Path:
    """The servers' interpreter (``make servers`` creates it)."""
    return aisp_home() / "servers" / "kserve" / "bin" / "python"


@contextlib.contextmanager
def kserve_server(models: dict[str, Path], log_path: Path, *, timeout_s: float = 90.0) -> Iterator[str]:
    """Serve ``{name: onnx file}`` over the Open Inference Protocol v2; yields the base URL.

    Raises:
        FileNotFoundError: No servers venv (run ``make servers``).
        RuntimeError: The server did not become ready (the log's tail in the message).
    """
    python = kserve_python()
    if not python.exists():
        raise FileNotFoundError(f"{python} is missing: run `make servers` (make test does)")
    http_port, grpc_port = find_free_port(), find_free_port()
    specs = [arg for name, path in models.items() for arg in ("--onnx", f"{name}={path}")]
    with log_path.open("wb") as log:
        server = subprocess.Popen([str(python), str(HERE / "kserve_onnx.py"), "--http_port", str(http_port),
                                   "--grpc_port", str(grpc_port), "--workers", "1", *specs],
                                  stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{http_port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the KServe server did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.5)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
