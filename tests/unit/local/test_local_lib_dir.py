"""The daemons' lib/ (flink-python on the TaskManager's class path, Beam parent-first): a session
cluster's TaskManager must not keep Beam's classes and buffers of every finished PyFlink job."""

import yaml

from pyflink_aisp.errors import EnvironmentSetupError
from pyflink_aisp.local import FlinkClusterConfig, daemon_env, flink_env, pyflink_home
from pyflink_aisp.local._flink_config import PARENT_FIRST_PATTERNS, write_flink_conf_dir, write_flink_lib_dir


def test_lib_dir_links_pyflink_lib_and_the_flink_python_jar(tmp_path):
    cfg = FlinkClusterConfig(state_dir=tmp_path)
    write_flink_conf_dir(cfg)
    home = pyflink_home()
    links = sorted(cfg.lib_dir.iterdir())
    expected = sorted([*(home / "lib").glob("*.jar"), *(home / "opt").glob("flink-python-*.jar")])
    assert sorted(p.resolve() for p in links) == sorted(p.resolve() for p in expected)
    assert any(p.name.startswith("flink-dist-") for p in links)  # config.sh needs it in FLINK_LIB_DIR
    assert [p.name for p in links if p.name.startswith("flink-python-")] == [
        p.name for p in (home / "opt").glob("flink-python-*.jar")
    ]
    assert all(p.is_symlink() and p.resolve().is_file() for p in links)


def test_daemons_start_with_the_lib_dir_and_clients_with_pyflinks(tmp_path):
    cfg = FlinkClusterConfig(state_dir=tmp_path)
    assert daemon_env(cfg)["FLINK_LIB_DIR"] == str(pyflink_home() / "lib")  # not written yet
    write_flink_conf_dir(cfg)
    assert daemon_env(cfg)["FLINK_LIB_DIR"] == str(tmp_path / "flink" / "lib")
    assert flink_env(cfg)["FLINK_LIB_DIR"] == str(pyflink_home() / "lib")


def test_config_loads_beam_parent_first(tmp_path):
    cfg = FlinkClusterConfig(state_dir=tmp_path)
    conf = yaml.safe_load((write_flink_conf_dir(cfg) / "config.yaml").read_text())
    patterns = conf["classloader.parent-first-patterns.additional"]
    assert patterns == list(PARENT_FIRST_PATTERNS) and "org.apache.beam." in patterns


def test_lib_dir_is_rewritten_not_appended(tmp_path):
    cfg = FlinkClusterConfig(state_dir=tmp_path)
    write_flink_lib_dir(cfg)
    (cfg.lib_dir / "stale.jar").write_bytes(b"x")
    write_flink_lib_dir(cfg)
    assert not (cfg.lib_dir / "stale.jar").exists()


def test_lib_dir_needs_exactly_one_flink_python_jar(tmp_path, monkeypatch):
    fake = tmp_path / "pyflink"
    (fake / "lib").mkdir(parents=True)
    (fake / "opt").mkdir()
    monkeypatch.setattr("pyflink_aisp.local._flink_config.pyflink_home", lambda: fake)
    try:
        write_flink_lib_dir(FlinkClusterConfig(state_dir=tmp_path / "state"))
    except EnvironmentSetupError as err:
        assert "0 flink-python jars" in str(err)
    else:
        raise AssertionError("no flink-python jar accepted")
