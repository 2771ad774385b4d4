"""Where a job finds the Flink Kafka connector jar (no dev-stack code, no download).

A production job names its jars (``--jars``, or ``$AISP_CONNECTOR_JARS``), or
finds them in the jar cache that ``aisp local jars`` (the dev stack) fills:
``<aisp_home>/jars/flink/*.jar``. Nothing is downloaded here: a job on a
cluster must not reach for Maven Central.
"""

from __future__ import annotations

import os
from pathlib import Path

from pyflink_aisp._home import aisp_home
from pyflink_aisp.errors import ConfigError

__all__ = ["CONNECTOR_JARS_ENV", "connector_jars"]

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
