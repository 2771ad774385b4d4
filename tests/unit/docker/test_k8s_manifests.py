"""docker/k8s/: the FlinkDeployment against the Flink Kubernetes Operator's CRD schema (from the
operator's API jar on Maven Central), core resources against Kubernetes' JSON schemas
(kubernetes-validate), and both against the image they run."""

import copy
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pyflink_aisp.jars import JarKind, ensure_jars
from pyflink_aisp.local import pyflink_home
from pyflink_aisp.local._flink_config import PROMETHEUS_FACTORY
from pyflink_aisp.pipeline import PipelineOptions, restart_settings

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "docker" / "k8s"
CRD_ENTRY = "META-INF/fabric8/flinkdeployments.flink.apache.org-v1.yml"
#: Flink 2.x values of FlinkDeployment.spec.flinkVersion, added by operator releases after 1.10.0
#: (the newest on Maven Central as reachable here, whose enum ends at v1_20): accepted on top of
#: the CRD's enum until connectors/flink-kubernetes-operator.pom.xml moves to such a release.
FLINK_2_VERSIONS = ("v2_0",)


def _docs(name):
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def _strict(schema):
    """The schema with unknown fields refused, as the API server's strict field validation does
    (objects with ``properties`` and neither ``additionalProperties`` nor preserve-unknown-fields)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def crd_schema():
    jar = next(j for j in ensure_jars(JarKind.K8S_OPERATOR) if "operator-api" in j.name)
    with zipfile.ZipFile(jar) as z:
        crd = yaml.safe_load(z.read(CRD_ENTRY))
    assert crd["spec"]["names"]["kind"] == "FlinkDeployment"
    version = next(v for v in crd["spec"]["versions"] if v["storage"])
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    enum = schema["properties"]["spec"]["properties"]["flinkVersion"]["enum"]
    enum.extend(v for v in FLINK_2_VERSIONS if v not in enum)
    # the API server checks these of every object itself; the CRD's schema leaves them out
    metadata = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema["properties"].update({"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                 "metadata": metadata})
    return crd["spec"]["group"] + "/" + version["name"], jsonschema.Draft4Validator(_strict(schema))


def _errors(validator, doc):
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_flinkdeployment_matches_the_operators_crd(crd_schema):
    api_version, validator = crd_schema
    (doc,) = _docs("flinkdeployment.yaml")
    assert (doc["apiVersion"], doc["kind"]) == (api_version, "FlinkDeployment")
    assert _errors(validator, doc) == []


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("spec", "jobManger"), {}, "Additional properties are not allowed ('jobManger' was unexpected)"),
        (("spec", "job", "upgradeMode"), "sometimes", "'sometimes' is not one of"),
        (("spec", "flinkVersion"), "v3_0", "'v3_0' is not one of"),
        (("spec", "job", "parallelism"), "two", "'two' is not of type 'integer'"),
    ],
)
def test_the_crd_check_catches_mistakes(crd_schema, path, value, expected):
    (doc,) = _docs("flinkdeployment.yaml")
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errors = _errors(crd_schema[1], doc)
    assert len(errors) == 1 and expected in errors[0], errors


@pytest.mark.parametrize("name", ["rbac.yaml", "storage.yaml"])
def test_core_resources_match_kubernetes_schemas(name):
    version = kubernetes_validate.latest_version()
    for doc in _docs(name):
        kubernetes_validate.validate(doc, version, strict=True)


def test_kubernetes_validate_catches_a_typo():
    (claim,) = _docs("storage.yaml")
    claim["spec"]["accessMode"] = claim["spec"].pop("accessModes")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(claim, kubernetes_validate.latest_version(), strict=True)


def test_flinkdeployment_runs_the_image_the_way_the_image_is_built():
    (doc,) = _docs("flinkdeployment.yaml")
    spec = doc["spec"]
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert spec["image"] == compose["x-flink"]["image"]
    conf = spec["flinkConfiguration"]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert f"AISP_PYTHON={conf['python.executable']}" in dockerfile
    assert conf["metrics.reporter.prom.factory.class"] == PROMETHEUS_FACTORY
    assert conf["kubernetes.entry.path"] == "/docker-entrypoint.sh"
    jar = spec["job"]["jarURI"].removeprefix("local:///opt/flink/")
    assert (pyflink_home() / jar).is_file(), f"{jar} is not in apache-flink's distribution"
    args = spec["job"]["args"]
    assert args[args.index("-pyclientexec") + 1] == conf["python.executable"]
    job = args[args.index("-py") + 1]
    assert (ROOT / "jobs" / job.removeprefix("/opt/aisp/jobs/")).is_file()
    options = PipelineOptions.from_args(args[args.index("-py") + 2:])
    assert options.parallelism == spec["job"]["parallelism"] == 2
    volume = spec["podTemplate"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert volume == _docs("storage.yaml")[0]["metadata"]["name"]

    assert spec["serviceAccount"] == _docs("rbac.yaml")[0]["metadata"]["name"]


def test_the_cluster_default_restart_strategy_is_the_jobs_own_in_the_deployment_and_the_images():
    """Issue 25: one set of restart defaults: the job's (flink_settings), the FlinkDeployment's cluster
    configuration, and the config.yaml every image role and the local stack render."""
    from pyflink_aisp.deploy._container import container_flink_config
    from pyflink_aisp.local import render_flink_config

    expected = restart_settings(None)
    assert expected["restart-strategy.type"] == "exponential-delay"
    conf = _docs("flinkdeployment.yaml")[0]["spec"]["flinkConfiguration"]
    assert {k: v for k, v in conf.items() if k.startswith("restart-strategy")} == expected
    env = {"AISP_JOBMANAGER_HOST": "jobmanager", "AISP_KAFKA_BOOTSTRAP": "kafka:9092"}
    rendered = yaml.safe_load(render_flink_config(container_flink_config(env), {}))
    assert {k: str(v) for k, v in rendered.items() if k.startswith("restart-strategy")} == expected
