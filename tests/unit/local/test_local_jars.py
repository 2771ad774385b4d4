"""Jar cache: markers, atomic fill, Maven/Java errors (a fake `mvn` on PATH, no network)."""

import json
import os
import stat
from pathlib import Path

import pytest

from pyflink_aisp import jars as _jars
from pyflink_aisp.errors import ConfigError, EnvironmentSetupError
from pyflink_aisp.jars import JarKind, ensure_jars, pipeline_jars_value, require_tools

FAKE_MVN = """#!/bin/sh
echo call >> "{calls}"
{body}
"""
COPY_JAR = """for a in "$@"; do case "$a" in -DoutputDirectory=*) d="${a#-DoutputDirectory=}";; esac; done
mkdir -p "$d" && echo jar > "$d/dep-1.0.jar" && echo jar > "$d/other-2.0.jar"
"""


@pytest.fixture
def connectors(tmp_path):
    folder = tmp_path / "connectors"
    folder.mkdir()
    (folder / "kafka-broker.pom.xml").write_text("<project>v1</project>")
    (folder / "flink-connectors.pom.xml").write_text("<project>f</project>")
    return folder


def _fake_mvn(tmp_path, monkeypatch, body):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    script = bin_dir / "mvn"
    script.write_text(FAKE_MVN.format(calls=calls, body=body))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    java = bin_dir / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def _count(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_resolves_once_and_caches(tmp_path, monkeypatch, connectors):
    calls = _fake_mvn(tmp_path, monkeypatch, COPY_JAR)
    cache = tmp_path / "jars"
    jars = ensure_jars("kafka-broker", cache_dir=cache, connectors=connectors)
    assert [j.name for j in jars] == ["dep-1.0.jar", "other-2.0.jar"]
    assert all(j.parent == cache / "kafka-broker" for j in jars)
    marker = json.loads((cache / "kafka-broker" / ".aisp-jars.json").read_text())
    assert marker["jars"] == ["dep-1.0.jar", "other-2.0.jar"]
    assert ensure_jars(JarKind.KAFKA_BROKER, cache_dir=cache, connectors=connectors) == jars
    assert _count(calls) == 1
    assert not [
        p for p in cache.iterdir() if p.name.startswith(".kafka-broker.") and p.is_dir()
    ]  # no temp dirs left


def test_changed_pom_or_missing_jar_re_resolves(tmp_path, monkeypatch, connectors):
    calls = _fake_mvn(tmp_path, monkeypatch, COPY_JAR)
    cache = tmp_path / "jars"
    jars = ensure_jars("kafka-broker", cache_dir=cache, connectors=connectors)
    (connectors / "kafka-broker.pom.xml").write_text("<project>v2</project>")
    ensure_jars("kafka-broker", cache_dir=cache, connectors=connectors)
    assert _count(calls) == 2
    jars[0].unlink()
    ensure_jars("kafka-broker", cache_dir=cache, connectors=connectors)
    assert _count(calls) == 3


def test_maven_failure_keeps_old_cache_and_reports_tail(tmp_path, monkeypatch, connectors):
    _fake_mvn(tmp_path, monkeypatch, 'echo "[ERROR] Could not transfer artifact"; exit 1')
    with pytest.raises(EnvironmentSetupError, match="Maven Central") as info:
        ensure_jars("flink", cache_dir=tmp_path / "jars", connectors=connectors)
    assert "Could not transfer artifact" in str(info.value)
    assert not (tmp_path / "jars" / "flink").exists()


def test_maven_resolving_nothing_is_an_error(tmp_path, monkeypatch, connectors):
    _fake_mvn(tmp_path, monkeypatch, "exit 0")
    with pytest.raises(EnvironmentSetupError, match="no jars"):
        ensure_jars("flink", cache_dir=tmp_path / "jars", connectors=connectors)


def test_missing_tools(monkeypatch, tmp_path, connectors):
    monkeypatch.setattr(_jars.shutil, "which", lambda name: None)
    with pytest.raises(EnvironmentSetupError, match="apt-get install maven openjdk-17-jdk-headless"):
        require_tools("java", "mvn")
    with pytest.raises(EnvironmentSetupError, match="mvn"):
        ensure_jars("flink", cache_dir=tmp_path / "jars", connectors=connectors)


def test_unknown_kind():
    with pytest.raises(ConfigError, match="unknown jar kind"):
        ensure_jars("spark")


def test_without_the_manifests_a_filled_cache_is_used_else_explained(tmp_path, monkeypatch):
    def missing() -> Path:
        raise EnvironmentSetupError("/x/connectors/*.pom.xml not found: reinstall pyflink-aisp")

    monkeypatch.setattr(_jars, "connectors_dir", missing)
    with pytest.raises(EnvironmentSetupError, match="reinstall"):
        ensure_jars("flink", cache_dir=tmp_path)
    dest = tmp_path / "flink"
    dest.mkdir()
    (dest / "a.jar").write_text("x")
    (dest / ".aisp-jars.json").write_text(json.dumps({"pom_sha256": "old", "jars": ["a.jar"]}))
    assert ensure_jars("flink", cache_dir=tmp_path) == [dest / "a.jar"]


def test_pipeline_jars_value():
    value = pipeline_jars_value([Path("/x/a.jar"), Path("/y/b c.jar")])
    assert value == "file:///x/a.jar;file:///y/b%20c.jar"


def test_the_manifests_ship_in_the_package_as_a_link_to_the_top_level_folder():
    """pyflink_aisp/connectors (package data, see pyproject.toml) is connectors/ in a checkout."""
    root = Path(_jars.__file__).resolve().parents[1]
    assert (Path(_jars.__file__).parent / "connectors").is_symlink()
    assert _jars.connectors_dir() == (root / "connectors").resolve()


def test_real_connectors_dir_has_both_poms():
    folder = _jars.connectors_dir()
    for kind in JarKind:
        assert (folder / kind.pom_name).is_file()


def test_broker_pom_pins_slf4j_2():
    text = (_jars.connectors_dir() / "kafka-broker.pom.xml").read_text()
    assert "<artifactId>slf4j-api</artifactId>" in text
    assert "<slf4j.version>2.0." in text


def test_flink_models_are_fetched_with_dependency_copy_from_the_poms_artifact_items(
        tmp_path, monkeypatch, connectors):
    """Their parent pom is not on Maven Central, so copy-dependencies cannot read them: `copy` with
    the pom's artifactItems fetches the shaded jars alone."""
    args = tmp_path / "args"
    calls = _fake_mvn(tmp_path, monkeypatch, f'echo "$@" > "{args}"\n{COPY_JAR}')
    (connectors / "flink-models.pom.xml").write_text("<project>m</project>")
    ensure_jars(JarKind.FLINK_MODELS, cache_dir=tmp_path / "jars", connectors=connectors)
    assert "dependency:copy " in args.read_text() and _count(calls) == 1
    ensure_jars(JarKind.FLINK, cache_dir=tmp_path / "jars", connectors=connectors)
    assert "dependency:copy-dependencies " in args.read_text()
    items = (_jars.connectors_dir() / "flink-models.pom.xml").read_text()
    for artifact in ("flink-model-triton", "flink-model-openai"):
        assert f"<artifactId>{artifact}</artifactId>\n                <version>2.3.0</version>" in items
