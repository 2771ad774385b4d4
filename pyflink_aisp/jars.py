"""Jar cache: JVM jars resolved from Maven Central by the poms in ``connectors/``.

``ensure_jars(JarKind.KAFKA_BROKER)`` gives the Kafka broker classpath,
``ensure_jars(JarKind.FLINK)`` the Flink Kafka SQL connector (uber jar) that jobs
load through ``pipeline.jars``, ``ensure_jars(JarKind.SQL_GATEWAY)`` the SQL gateway
jar that ``bin/sql-client.sh`` needs (``aisp sql``), ``ensure_jars(JarKind.K8S_OPERATOR)``
the Flink Kubernetes Operator's API jar (its CRD schemas, for the manifest checks),
``ensure_jars(JarKind.SCHEMA_REGISTRY)`` Apicurio Registry's bundle (a zip). Jars
land in ``<aisp_home>/jars/<kind>/`` next to a marker holding the pom's sha256, so editing
a pom re-resolves on next use.

A job finds its connector jar with :func:`connector_jars` (no download there: a job
on a cluster must not reach for Maven Central): the jars it is given (``--jars``,
or ``$AISP_CONNECTOR_JARS``), else the cache that ``aisp local jars`` fills.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path

from pyflink_aisp.errors import ConfigError, EnvironmentSetupError
from pyflink_aisp.home import aisp_home

__all__ = [
    "CONNECTOR_JARS_ENV",
    "JarKind",
    "connector_jars",
    "connectors_dir",
    "ensure_jars",
    "flink_connector_jars",
    "pipeline_jars_value",
    "require_tools",
]

_MARKER = ".aisp-jars.json"
_INSTALL_HINT = "install them with `apt-get install maven openjdk-17-jdk-headless`"


class JarKind(StrEnum):
    """Which jar set to resolve; the value names the cache folder."""

    KAFKA_BROKER = "kafka-broker"
    FLINK = "flink"
    SQL_GATEWAY = "sql-gateway"
    #: the Flink Kubernetes Operator's API jar (its CRDs; read by the manifest checks, never run)
    K8S_OPERATOR = "flink-kubernetes-operator"
    #: Apicurio Registry's runnable bundle (a zip), a Confluent-compatible Schema Registry
    SCHEMA_REGISTRY = "schema-registry"
    #: Flink's own ML_PREDICT model providers (flink-model-triton, flink-model-openai), for the
    #: side-by-side in ``bench/remote_bench.py``; no job of the suite loads them
    FLINK_MODELS = "flink-models"

    @property
    def pom_name(self) -> str:
        """File name of the pom in ``connectors/`` that pins this set."""
        return {
            "kafka-broker": "kafka-broker.pom.xml",
            "flink": "flink-connectors.pom.xml",
            "sql-gateway": "flink-sql-gateway.pom.xml",
            "flink-kubernetes-operator": "flink-kubernetes-operator.pom.xml",
            "schema-registry": "schema-registry.pom.xml",
            "flink-models": "flink-models.pom.xml",
        }[self.value]

    @property
    def maven_goal(self) -> str:
        """The dependency plugin goal that fetches this set: ``copy-dependencies`` (the pom's
        dependencies and theirs), or ``copy`` (the pom's ``artifactItems`` alone, for jars whose
        descriptors Maven Central cannot serve)."""
        return "copy" if self is JarKind.FLINK_MODELS else "copy-dependencies"


def require_tools(*names: str) -> dict[str, str]:
    """Locate executables on PATH.

    Args:
        names: Executables to find (e.g. ``"java"``, ``"mvn"``).

    Returns:
        Name to absolute path.

    Raises:
        EnvironmentSetupError: If any is missing (the message says what to install).
    """
    found = {name: shutil.which(name) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise EnvironmentSetupError(
            f"{', '.join(missing)} not found on PATH; the local stack needs Java 17 and "
            f"Maven: {_INSTALL_HINT}"
        )
    return {name: path for name, path in found.items() if path is not None}


def _jar_kind(kind: JarKind | str) -> JarKind:
    try:
        return JarKind(kind)
    except ValueError as exc:
        choices = ", ".join(k.value for k in JarKind)
        raise ConfigError(f"unknown jar kind {kind!r}; expected one of {choices}") from exc


def connectors_dir() -> Path:
    """The folder of the Maven manifests: ``pyflink_aisp/connectors``, in a source checkout a link
    to the top-level ``connectors/``, in an installed package its copy (package data).

    Raises:
        EnvironmentSetupError: The manifests are missing (a broken install).
    """
    folder = (Path(__file__).parent / "connectors").resolve()
    if not any(folder.glob("*.pom.xml")):
        raise EnvironmentSetupError(f"{folder}/*.pom.xml not found: reinstall pyflink-aisp (the Maven "
                                    "manifests of its jars ship in the package)")
    return folder


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cached_jars(dest: Path, pom_sha256: str | None) -> list[Path] | None:
    """The cached jars if ``dest`` is complete for this pom (any pom if None), else None."""
    try:
        marker = json.loads((dest / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if pom_sha256 is not None and marker.get("pom_sha256") != pom_sha256:
        return None
    jars = [dest / name for name in marker.get("jars", [])]
    if not jars or not all(jar.is_file() for jar in jars):
        return None
    return sorted(jars)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_jars(
    kind: JarKind | str,
    *,
    cache_dir: Path | None = None,
    connectors: Path | None = None,
    timeout_s: float = 900.0,
) -> list[Path]:
    """Return the jars of ``kind``, resolving them with Maven first when needed.

    Runs ``mvn -q -B -f connectors/<pom> dependency:<maven_goal>`` into a temp
    folder and renames it into place, so an interrupted download never looks
    complete. Safe to call from several processes (file lock). Where the manifests
    are missing (a broken install) an already filled cache is used as it is.

    Args:
        kind: ``"kafka-broker"`` or ``"flink"`` (or a :class:`JarKind`).
        cache_dir: Parent of the per-kind folders; default ``<aisp_home>/jars``.
        connectors: Folder with the poms; default :func:`connectors_dir`.
        timeout_s: Limit for the Maven run, seconds.

    Returns:
        Absolute jar paths, sorted by name.

    Raises:
        ConfigError: Unknown ``kind``.
        EnvironmentSetupError: No manifests and no filled cache, no ``mvn``/``java``, or Maven failed.
    """
    kind = _jar_kind(kind)
    parent = cache_dir or aisp_home() / "jars"
    dest = parent / kind.value
    try:
        pom = (connectors or connectors_dir()) / kind.pom_name
    except EnvironmentSetupError:
        cached = _cached_jars(dest, None)  # regular install: take a filled cache as is
        if cached is None:
            raise
        return cached
    if not pom.is_file():
        raise EnvironmentSetupError(f"pom not found: {pom}")
    pom_sha256 = _sha256(pom)
    cached = _cached_jars(dest, pom_sha256)
    if cached is not None:
        return cached
    with _locked(parent / f".{kind.value}.lock"):
        cached = _cached_jars(dest, pom_sha256)  # another process may have finished
        if cached is not None:
            return cached
        return _resolve_into(pom, pom_sha256, dest, timeout_s, kind.maven_goal)


def _resolve_into(pom: Path, pom_sha256: str, dest: Path, timeout_s: float,
                  goal: str = "copy-dependencies") -> list[Path]:
    tools = require_tools("java", "mvn")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        _run_maven(tools["mvn"], pom, tmp, timeout_s, goal)
        jars = sorted(p.name for p in tmp.iterdir() if p.suffix in (".jar", ".zip"))  # zip: a bundle
        if not jars:
            raise EnvironmentSetupError(f"Maven resolved no jars from {pom}")
        marker = {"pom": str(pom), "pom_sha256": pom_sha256, "jars": jars}
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2), encoding="utf-8")
        _swap_in(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [dest / name for name in jars]


def _run_maven(mvn: str, pom: Path, out_dir: Path, timeout_s: float,
               goal: str = "copy-dependencies") -> None:
    cmd = [
        mvn, "-q", "-B", "-f", str(pom), f"dependency:{goal}",
        f"-DoutputDirectory={out_dir}", "-DincludeScope=runtime",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentSetupError(
            f"Maven did not finish within {timeout_s:.0f} s resolving {pom.name}; "
            "check network access to Maven Central (https://repo.maven.apache.org)"
        ) from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise EnvironmentSetupError(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}). Jars come from Maven "
            "Central: check network access / proxy settings (~/.m2/settings.xml).\n"
            f"Maven output (tail):\n{tail}"
        )


def _swap_in(tmp: Path, dest: Path) -> None:
    """Replace ``dest`` by ``tmp`` with renames (old copy removed afterwards)."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old.{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def flink_connector_jars(*, cache_dir: Path | None = None) -> list[Path]:
    """The Flink connector jars jobs need (the ``flink-sql-connector-kafka`` uber jar).

    Raises:
        EnvironmentSetupError: As :func:`ensure_jars`.
    """
    return ensure_jars(JarKind.FLINK, cache_dir=cache_dir)


def pipeline_jars_value(jars: Sequence[Path] | None = None) -> str:
    """The ``pipeline.jars`` value: ``file://`` URLs joined with ``;``.

    Args:
        jars: Jars to list; default :func:`flink_connector_jars`.

    Raises:
        EnvironmentSetupError: As :func:`ensure_jars` (only when ``jars`` is None).
    """
    chosen = flink_connector_jars() if jars is None else jars
    return ";".join(Path(jar).resolve().as_uri() for jar in chosen)

#: Environment variable with ``;``-separated connector jar URLs or paths.
CONNECTOR_JARS_ENV = "AISP_CONNECTOR_JARS"


def _as_uri(entry: str) -> str:
    return entry if "://" in entry else Path(entry).resolve().as_uri()


def connector_jars(jars: str | None = None) -> list[str]:
    """The jar URLs for ``pipeline.jars``.

    Args:
        jars: ``;``-separated ``file://`` URLs or paths (the ``--jars`` option);
            None: ``$AISP_CONNECTOR_JARS``, else the jar cache.

    Returns:
        ``file://`` (or other scheme) URLs, in order.

    Raises:
        ConfigError: No jar named and none cached (the message says how to get one).
    """
    chosen = jars or os.environ.get(CONNECTOR_JARS_ENV)
    if chosen:
        return [_as_uri(entry.strip()) for entry in chosen.split(";") if entry.strip()]
    cached = sorted((aisp_home() / "jars" / "flink").glob("*.jar"))
    if not cached:
        raise ConfigError(
            "no Flink Kafka connector jar: pass --jars file:///path/flink-sql-connector-kafka-5.0.0-2.2.jar, "
            f"set ${CONNECTOR_JARS_ENV}, or fill the dev cache with `aisp local jars`"
        )
    return [jar.resolve().as_uri() for jar in cached]
