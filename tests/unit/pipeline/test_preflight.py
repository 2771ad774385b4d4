"""Pre-flight of the job's environment: one line naming the problem and the fix (issue 9.4)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.pipeline import InferenceOptions
from pyflink_aisp.pipeline._preflight import (
    KAFKA_FACTORY,
    check_connector_jars,
    check_model_paths,
    check_python,
)

SERVICES = "META-INF/services/org.apache.flink.table.factories.Factory"


FACTORY_CLASS = KAFKA_FACTORY.replace(".", "/") + ".class"
SHADED_CLIENT = "org/apache/flink/kafka/shaded/org/apache/kafka/clients/consumer/KafkaConsumer.class"
PLAIN_CLIENT = "org/apache/kafka/clients/consumer/KafkaConsumer.class"


def _jar(path: Path, factories: list[str], classes: tuple[str, ...] = ()) -> Path:
    """A jar listing ``factories`` as table factories and holding ``classes`` (empty entries);
    a listed Kafka factory gets its class and the shaded client unless ``classes`` says otherwise."""
    if KAFKA_FACTORY in factories and not classes:
        classes = (FACTORY_CLASS, SHADED_CLIENT)
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr(SERVICES, "# licence header\n\n" + "\n".join(factories) + "\n")
        for name in classes:
            jar.writestr(name, b"")
    return path


def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_a_missing_jar_is_one_line_naming_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        check_connector_jars(["file:///nonexistent/kafka.jar"])
    message = _one_line(exc)
    assert message.startswith("connector jar /nonexistent/kafka.jar does not exist: pass --jars file:///")
    assert "aisp local jars" in message


def test_a_file_that_is_not_a_jar_and_a_jar_without_the_factory_are_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.jar"
    text.write_text("not a zip")
    with pytest.raises(ConfigError) as exc:
        check_connector_jars([text.as_uri()])
    assert _one_line(exc).startswith(f"connector jar {text} is not a jar (")
    other = _jar(tmp_path / "jdbc.jar", ["org.apache.flink.connector.jdbc.table.JdbcDynamicTableFactory"])
    with pytest.raises(ConfigError) as exc:
        check_connector_jars([other.as_uri()])
    assert _one_line(exc).startswith(f"no jar of --jars ({other.as_uri()}) provides the Flink Kafka "
                                     f"connector ({KAFKA_FACTORY}): ")


def test_any_jar_that_provides_the_factory_passes_and_remote_urls_are_the_clusters(tmp_path: Path) -> None:
    other = _jar(tmp_path / "a.jar", ["x.Y"])
    kafka = _jar(tmp_path / "kafka connector.jar", [KAFKA_FACTORY, "x.Z"])
    check_connector_jars([other.as_uri(), kafka.as_uri()])  # a space in the path: URL-quoted
    check_connector_jars([str(kafka)])
    check_connector_jars(["https://repo.example/flink-sql-connector-kafka.jar"])
    with pytest.raises(ConfigError):
        check_connector_jars([(tmp_path / "gone.jar").as_uri(), "https://repo.example/k.jar"])


def test_the_real_connector_jar_of_the_cache_passes() -> None:
    from pyflink_aisp.jars import flink_connector_jars

    check_connector_jars([Path(j).resolve().as_uri() for j in flink_connector_jars()])


def test_the_python_executable_is_found_or_named(tmp_path: Path) -> None:
    assert check_python(sys.executable) == sys.executable
    assert Path(check_python("sh")).name == "sh"
    with pytest.raises(ConfigError) as exc:
        check_python(str(tmp_path / "venv" / "bin" / "python"))
    expected = f"the workers' Python executable {tmp_path}/venv/bin/python does not exist"
    assert _one_line(exc).startswith(expected)
    with pytest.raises(ConfigError) as exc:
        check_python("python-that-is-nowhere")
    assert "is not on PATH" in _one_line(exc)
    plain = tmp_path / "python"
    plain.write_text("#!/bin/sh\n")  # not executable
    with pytest.raises(ConfigError):
        check_python(str(plain))


def test_model_paths_named_by_the_options_must_be_there(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("AISP_MODEL_DIR", raising=False)
    check_model_paths(InferenceOptions())
    with pytest.raises(ConfigError) as exc:
        check_model_paths(InferenceOptions(model_dir=tmp_path / "missing"))
    assert _one_line(exc).startswith(f"--model-dir {tmp_path}/missing is not a directory")
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    with pytest.raises(ConfigError) as exc:
        check_model_paths(InferenceOptions(encoder_onnx=tmp_path / "e.onnx", encoder_tokenizer=tokenizer))
    assert _one_line(exc) == f"--encoder-onnx {tmp_path}/e.onnx is not a readable file"
    with pytest.raises(ConfigError) as exc:
        check_model_paths(InferenceOptions(predictor=tmp_path / "risk.onnx"))
    assert _one_line(exc) == f"--predictor {tmp_path}/risk.onnx is not a readable file"
    with pytest.raises(ConfigError) as exc:
        check_model_paths(InferenceOptions(model_pointer=tmp_path / "no" / "dir" / "p.json"))
    assert "its directory does not exist" in _one_line(exc)
    (tmp_path / "cls").mkdir()
    (tmp_path / "cls" / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as exc:
        check_model_paths(InferenceOptions(classifier=tmp_path / "cls"))
    assert _one_line(exc) == (f"--classifier {tmp_path}/cls is not a sequence-classification model "
                              "directory: ['tokenizer.json', 'model.onnx'] missing or unreadable (it needs "
                              "['config.json', 'tokenizer.json', 'model.onnx'])")


def test_every_jar_is_checked_not_only_up_to_the_connector(tmp_path: Path) -> None:
    kafka = _jar(tmp_path / "kafka.jar", [KAFKA_FACTORY])
    with pytest.raises(ConfigError) as exc:
        check_connector_jars([kafka.as_uri(), (tmp_path / "missing.jar").as_uri()])
    assert _one_line(exc).startswith(f"connector jar {tmp_path}/missing.jar does not exist")
    with pytest.raises(ConfigError) as exc:
        check_connector_jars([kafka.as_uri(), str(tmp_path)])
    assert _one_line(exc).startswith(f"connector jar {tmp_path} is a directory, not a jar")


def test_a_listed_factory_without_its_class_or_its_kafka_client_is_refused(tmp_path: Path) -> None:
    services_only = _jar(tmp_path / "fake.jar", [KAFKA_FACTORY], classes=("x/Other.class",))
    with pytest.raises(ConfigError) as exc:
        check_connector_jars([services_only.as_uri()])
    assert "provides the Flink Kafka connector" in _one_line(exc)
    thin = _jar(tmp_path / "thin.jar", [KAFKA_FACTORY], classes=(FACTORY_CLASS,))
    with pytest.raises(ConfigError) as exc:
        check_connector_jars([thin.as_uri()])
    assert "not the Kafka client it needs" in _one_line(exc)
    clients = _jar(tmp_path / "kafka-clients.jar", [], classes=(PLAIN_CLIENT,))
    check_connector_jars([thin.as_uri(), clients.as_uri()])  # the thin connector beside kafka-clients
