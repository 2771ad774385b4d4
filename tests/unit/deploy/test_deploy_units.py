"""aisp package / aisp sql pieces that need no cluster: env key, flink run argv, job ids, checks."""

import os
import sys
from pathlib import Path

import pytest

from pyflink_aisp.deploy import EnvArchive, JobPackage, env_key, job_ids, sql_client_command
from pyflink_aisp.errors import ConfigError, EnvironmentSetupError
from pyflink_aisp.local import LocalStack, LocalStackConfig
from pyflink_aisp.models import ModelAssets
from pyflink_aisp.pipeline._preflight import archive_targets, check_python


def _tree(root: Path, source: str) -> Path:
    (root / "pyflink_aisp").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "pyflink_aisp" / "a.py").write_text(source)
    return root


def test_env_key_follows_the_sources_the_python_and_uv(tmp_path):
    a = _tree(tmp_path / "a", "x = 1\n")
    b = _tree(tmp_path / "b", "x = 1\n")
    c = _tree(tmp_path / "c", "x = 2\n")
    python = Path(sys.executable)
    assert env_key(a, python, "uv 1") == env_key(b, python, "uv 1")  # same inputs, other folder
    assert env_key(a, python, "uv 1") != env_key(c, python, "uv 1")
    assert env_key(a, python, "uv 1") != env_key(a, python, "uv 2")
    assert env_key(a, python, "uv 1") != env_key(a, Path("/other/python3.11"), "uv 1")
    (b / "pyflink_aisp" / "__pycache__").mkdir()
    (b / "pyflink_aisp" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert env_key(a, python, "uv 1") == env_key(b, python, "uv 1")  # bytecode is not an input


def _package(tmp_path: Path) -> JobPackage:
    model_dir = tmp_path / "pkg" / "model"
    model = ModelAssets(directory=model_dir, onnx_path=model_dir / "model.onnx", sha256="a" * 64,
                        tokenizer_path=model_dir / "tokenizer.json", tokenizer_sha256="b" * 64,
                        heldout_accuracy=0.77, train_size=10, heldout_size=5, source_distribution="d",
                        source_version="1", build_seconds=1.0)
    env = EnvArchive(path=tmp_path / "aisp-env-x.tar.gz", key="c" * 64, built=False, size_bytes=1)
    root = tmp_path / "pkg"
    return JobPackage(directory=root, env=env, model=model, jars=(root / "jars" / "k.jar",),
                      module="pyflink_aisp.jobs.review_sentiment", flink="/opt/flink/bin/flink",
                      jobmanager="jm:8081")


def test_flink_run_argv_of_a_package(tmp_path):
    pkg = _package(tmp_path)
    argv = pkg.run_command("--input-topic", "in", detached=True)
    root = tmp_path / "pkg"
    assert argv == [
        "/opt/flink/bin/flink", "run", "-d", "-m", "jm:8081",
        "-pyarch", f"{(root / 'aisp-env.tar.gz').as_uri()}#aisp-env",
        "-pyexec", "aisp-env/venv/bin/python", "-pyclientexec", "aisp-env/venv/bin/python",
        "-pym", "pyflink_aisp.jobs.review_sentiment", "--jars", (root / "jars" / "k.jar").as_uri(),
        "--model-dir", str(root / "model"), "--input-topic", "in",
    ]
    assert pkg.command_line("--input-topic", "a b").endswith("--input-topic 'a b'")


def test_package_directory_must_be_absolute(tmp_path):
    pkg = _package(tmp_path)
    with pytest.raises(ConfigError, match="absolute"):
        JobPackage(directory=Path("rel"), env=pkg.env, model=pkg.model, jars=(), module=pkg.module,
                   flink="flink", jobmanager="x:1")


def test_archive_targets_follow_flinks_path_hash_target_format():
    assert archive_targets("file:///a/env.tar.gz#aisp-env, /b/venv.zip") == {
        "aisp-env": "file:///a/env.tar.gz", "venv.zip": "/b/venv.zip"}
    assert archive_targets(None) == {}


def test_a_python_inside_a_shipped_archive_is_checked_by_its_archive(tmp_path):
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"x")
    assert check_python("aisp-env/venv/bin/python", f"{archive.as_uri()}#aisp-env") == \
        "aisp-env/venv/bin/python"
    with pytest.raises(ConfigError, match=r"the Python archive file:///nowhere/env.tar.gz of the workers' "
                                          r"Python aisp-env/venv/bin/python is not a readable file"):
        check_python("aisp-env/venv/bin/python", "file:///nowhere/env.tar.gz#aisp-env")
    with pytest.raises(ConfigError, match="does not exist"):  # not in an archive: checked here as before
        check_python("other/venv/bin/python", f"{archive.as_uri()}#aisp-env")


def test_job_ids_from_sql_client_output():
    out = ("[INFO] SQL update statement has been successfully submitted to the cluster:\n"
           "Job ID: 82e91707b810b051baa5a45c9d513959\n\nFlink SQL> \n"
           "Job ID: 0123456789abcdef0123456789abcdef\n")
    assert job_ids(out) == ["82e91707b810b051baa5a45c9d513959", "0123456789abcdef0123456789abcdef"]
    assert job_ids("[ERROR] Could not execute SQL statement.") == []


def test_sql_refuses_a_missing_file_and_a_stopped_cluster(tmp_path):
    stack = LocalStack(LocalStackConfig(state_dir=tmp_path))
    with pytest.raises(ConfigError, match=r"SQL file .*nope\.sql is not a readable file"):
        sql_client_command(stack, tmp_path / "nope.sql")
    script = tmp_path / "ok.sql"
    script.write_text("SELECT 1;")
    with pytest.raises(EnvironmentSetupError, match="local Flink cluster is not running"):
        sql_client_command(stack, script)


def test_public_api_is_sorted_and_importable():
    import importlib

    import pyflink_aisp.deploy as deploy

    assert deploy.__all__ == sorted(deploy.__all__)
    for module in ("_env", "_package", "_sql", "_cli"):
        mod = importlib.import_module(f"pyflink_aisp.deploy.{module}")
        assert all(hasattr(mod, name) for name in mod.__all__), module
    assert all(hasattr(deploy, name) for name in deploy.__all__)


def test_sql_run_reads_the_clients_error_and_job_ids():
    from pyflink_aisp.deploy import SqlRun

    output = ("Flink SQL> \x1b[31;1m[ERROR] Could not execute SQL statement. Reason:\n"
              "org.apache.calcite.X: Object 't' not found\x1b[0m\n\ndone.\n")
    failed = SqlRun(returncode=0, output=output)
    assert not failed.ok
    assert failed.error == ("Could not execute SQL statement. Reason: "
                            "org.apache.calcite.X: Object 't' not found")
    done = SqlRun(returncode=0, output="[INFO] submitted:\nJob ID: 82e91707b810b051baa5a45c9d513959\n")
    assert done.ok and done.error is None and done.job_ids == ["82e91707b810b051baa5a45c9d513959"]
    assert not SqlRun(returncode=2, output="").ok


def test_the_env_cache_keeps_the_two_newest_archives(tmp_path):
    from pyflink_aisp.deploy._env import _prune

    for i, name in enumerate(["a", "b", "c"]):
        path = tmp_path / f"aisp-env-{name}.tar.gz"
        path.write_bytes(b"x")
        os.utime(path, (1000 + i, 1000 + i))
    (tmp_path / "other.txt").write_text("kept")
    _prune(tmp_path, keep=2)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["aisp-env-b.tar.gz", "aisp-env-c.tar.gz", "other.txt"]


def test_the_archive_is_pinned_to_the_versions_installed_here():
    import importlib.metadata

    from pyflink_aisp.deploy._env import installed_pins

    pins = installed_pins().splitlines()
    assert f"apache-flink=={importlib.metadata.version('apache-flink')}" in pins
    assert f"tokenizers=={importlib.metadata.version('tokenizers')}" in pins
    assert not any(pin.lower().startswith(("pyflink-aisp==", "pyflink_aisp==")) for pin in pins)
    assert pins == sorted(pins, key=str.lower) and all("==" in pin for pin in pins)
