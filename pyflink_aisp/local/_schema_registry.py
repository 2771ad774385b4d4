"""A Confluent-compatible Schema Registry on this host: Apicurio Registry's runnable bundle.

:func:`ensure_schema_registry` resolves the bundle (``connectors/schema-registry.pom.xml``, a
zip from Maven Central, into the jar cache) and unpacks it once into
``<aisp_home>/schema-registry/<bundle>/``; :class:`SchemaRegistryServer` runs its Quarkus runner
jar with in-memory storage on a loopback port, so every start begins empty. Its Confluent API
is :attr:`SchemaRegistryServer.url` (``/apis/ccompat/v7``): what ``--schema-registry-url`` and
Confluent's own clients take.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import IO

import httpx

from pyflink_aisp.errors import EnvironmentSetupError
from pyflink_aisp.home import aisp_home
from pyflink_aisp.jars import JarKind, ensure_jars, require_tools
from pyflink_aisp.local._procs import find_free_port, wait_until

__all__ = ["CCOMPAT_PATH", "SchemaRegistryServer", "ensure_schema_registry"]

#: Where Apicurio Registry serves the Confluent Schema Registry API.
CCOMPAT_PATH = "/apis/ccompat/v7"


def ensure_schema_registry(cache_dir: Path | None = None) -> Path:
    """The runner jar of the unpacked bundle (resolved and unpacked on first use).

    Raises:
        EnvironmentSetupError: Maven cannot resolve the bundle, or it holds no runner jar.
    """
    (bundle,) = ensure_jars(JarKind.SCHEMA_REGISTRY)
    parent = cache_dir or aisp_home() / "schema-registry"
    dest = parent / bundle.stem
    if not any(dest.glob("*-runner.jar")):
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{bundle.stem}.", dir=parent))
        try:
            with zipfile.ZipFile(bundle) as archive:
                archive.extractall(tmp)
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)  # a reader never sees a half-unpacked bundle
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    runners = sorted(dest.glob("*-runner.jar"))
    if not runners:
        raise EnvironmentSetupError(f"{bundle} holds no *-runner.jar: not Apicurio's runnable bundle")
    return runners[0]


class SchemaRegistryServer:
    """Apicurio Registry in a child process (in-memory storage, loopback only).

    Args:
        log_path: The server's stdout and stderr.
        port: Its HTTP port (default: a free one).
        heap_mib: The JVM's ``-Xmx``.

    Use as a context manager, or :meth:`start` / :meth:`stop`.
    """

    def __init__(self, log_path: Path, *, port: int | None = None, heap_mib: int = 256) -> None:
        self.log_path = Path(log_path)
        self.port = port or find_free_port()
        self.heap_mib = heap_mib
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent Schema Registry API (``--schema-registry-url``)."""
        return self.base_url + CCOMPAT_PATH

    def ready(self) -> bool:
        """Whether its health check says ready."""
        try:
            return httpx.get(f"{self.base_url}/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, *, timeout_s: float = 120.0) -> SchemaRegistryServer:
        """Start the server and wait until it is ready.

        Raises:
            EnvironmentSetupError: No java, the bundle cannot be had, or the server exits or is
                not ready within ``timeout_s`` (the message ends with its log's tail).
        """
        java = require_tools("java")["java"]
        runner = ensure_schema_registry()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            [java, f"-Xmx{self.heap_mib}m", "-XX:+UseSerialGC", "-Dquarkus.http.host=127.0.0.1",
             f"-Dquarkus.http.port={self.port}", "-jar", str(runner)],
            cwd=runner.parent, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = self._proc
        came_up = wait_until(lambda: proc.poll() is not None or self.ready(), timeout_s, 0.5)
        if not came_up or proc.poll() is not None:
            self.stop()
            tail = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            raise EnvironmentSetupError(f"the schema registry on port {self.port} did not become ready in "
                                        f"{timeout_s:.0f} s; its log ({self.log_path}) ends:\n"
                                        + "\n".join(tail))
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 20 s)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=20)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> SchemaRegistryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
