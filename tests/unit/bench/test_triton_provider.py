"""bench/_triton_provider.py: what Flink's triton provider needs to run against the bench's V2 server."""

from __future__ import annotations

import subprocess
import zipfile

import numpy as np
import onnxruntime as ort
import pytest

from pyflink_aisp.models import build_intent_head


def test_the_capitalized_copy_computes_the_same_under_upper_case_names(bench_module, tmp_path):
    provider = bench_module("_triton_provider")
    head = build_intent_head(tmp_path / "head.onnx")
    caps = provider.capitalized_model(head, tmp_path / "caps.onnx")
    before, after = ort.InferenceSession(str(head)), ort.InferenceSession(str(caps))
    assert [i.name for i in after.get_inputs()] == ["EMBEDDING"]
    assert [o.name for o in after.get_outputs()] == ["LABEL", "PROBABILITIES"]
    x = np.random.default_rng(0).standard_normal((5, 384)).astype(np.float32)
    label, probabilities = before.run(None, {"embedding": x})
    label_caps, probabilities_caps = after.run(None, {"EMBEDDING": x})
    assert list(label_caps) == list(label)
    np.testing.assert_array_equal(probabilities_caps, probabilities)


def test_names_that_collide_in_capitals_are_refused(bench_module, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["x", "X"], ["y"])], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "X")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph), str(tmp_path / "g.onnx"))
    with pytest.raises(ValueError, match="collide in capitals"):
        bench_module("_triton_provider").capitalized_model(tmp_path / "g.onnx", tmp_path / "out.onnx")


def test_the_version_segment_is_dropped_from_infer_paths_only(bench_module):
    drop = bench_module("_triton_provider").without_version
    assert drop("/v2/models/m/versions/latest/infer") == "/v2/models/m/infer"
    assert drop("/v2/models/m/versions/3/infer") == "/v2/models/m/infer"
    assert drop("/v2/models/m/infer") == "/v2/models/m/infer"
    assert drop("/v2/models/m/versions/3") == "/v2/models/m/versions/3"


def test_the_provider_jar_compiles_and_registers_its_factory(bench_module, tmp_path):
    provider = bench_module("_triton_provider")
    jar = provider.provider_jar(tmp_path)
    with zipfile.ZipFile(jar) as z:
        names = set(z.namelist())
        services = z.read("META-INF/services/org.apache.flink.table.factories.Factory").decode().split()
    assert services == ["org.pyflinkaisp.bench.SchemaCheckedTritonFactory"]
    assert {"org/pyflinkaisp/bench/SchemaCheckedTritonFactory.class",
            "org/pyflinkaisp/bench/SchemaCheckedTritonFactory$Function.class"} <= names
    listing = subprocess.run(["javap", "-cp", str(jar), "org.pyflinkaisp.bench.SchemaCheckedTritonFactory"],
                             capture_output=True, text=True, check=True).stdout
    assert "extends org.apache.flink.model.triton.TritonModelProviderFactory" in listing
