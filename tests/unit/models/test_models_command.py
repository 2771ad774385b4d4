"""`aisp models list|check FILE`: each model's task, source and output fields; check loads each,
shows its graph and runs a probe; a model that cannot serve is one line and exit 1."""

from __future__ import annotations

from pyflink_aisp.cli import main
from pyflink_aisp.models import build_intent_head


def test_list_and_check_show_fields_graph_and_a_probe(tmp_path, capsys):
    build_intent_head(tmp_path / "head.onnx")
    registry = tmp_path / "models.yaml"
    registry.write_text("models:\n  risk: {task: predict, path: head.onnx, max-batch-size: 8}\n")
    assert main(["models", "list", str(registry)]) == 0
    out = capsys.readouterr().out
    assert f"risk: predict, {tmp_path / 'head.onnx'}, device cpu, max-batch-size 8" in out
    assert "fields: label STRING, probabilities ARRAY<FLOAT>" in out and "probe" not in out
    assert main(["models", "check", str(registry)]) == 0
    out = capsys.readouterr().out
    assert "inputs: embedding tensor(float) [None, 384]" in out
    assert "outputs: label tensor(string) [None], probabilities tensor(float) [None, 157]" in out
    assert "probe zeros(384) -> {'label': '" in out


def test_a_model_that_cannot_serve_is_one_line(tmp_path, capsys):
    (tmp_path / "broken.onnx").write_bytes(b"not a graph")
    registry = tmp_path / "models.yaml"
    registry.write_text("models:\n  broken: {task: predict, path: broken.onnx}\n")
    assert main(["models", "list", str(registry)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("aisp: error: cannot load ") and "broken.onnx" in err and "\n" not in err


def test_list_shows_each_route_and_refuses_a_broken_one(tmp_path, capsys):
    """The head's `probabilities` output makes it a cascade stage; a route to an unknown model fails
    in one line, as a job would."""
    build_intent_head(tmp_path / "head.onnx")
    registry = tmp_path / "models.yaml"
    registry.write_text("models:\n  risk: {task: predict, path: head.onnx}\n"
                        "  risk_b: {task: predict, path: head.onnx, max-batch-size: 4}\n"
                        "routes:\n  unsure: {cascade: [{model: risk, confidence: top, below: 0.4}, "
                        "{model: risk_b}]}\n")
    assert main(["models", "list", str(registry)]) == 0
    assert "route unsure: cascade risk (top < 0.4) -> risk_b, answer replace\n" in capsys.readouterr().out
    registry.write_text(registry.read_text().replace("{model: risk_b}", "{model: nowhere}"))
    assert main(["models", "list", str(registry)]) == 1
    err = capsys.readouterr().err.strip()
    assert "route unsure: last stage 'nowhere' is neither a model nor a route" in err and "\n" not in err
