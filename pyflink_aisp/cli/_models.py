"""``aisp models list|check FILE`` (the model registry) and ``aisp model intent-head``.

``list`` reads the registry and shows each model's task, source, device, batch size and
output fields with their SQL types, then each route in one line (``routes:``, checked as a job
would: every target a model or route, no cycle) (the fields come from the model's files: a classifier's
``config.json``, a numeric model's graph); ``check`` also loads every model on its device,
shows its graph inputs and outputs as ONNX Runtime reports them and runs a probe (two texts,
or a zero feature vector of the model's width) through it. Either exits 1 with one line for
the first model that cannot serve.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_model_registry_commands"]

#: What ``check`` runs through a text model (written for it).
_PROBE_TEXTS = ("set a timer for ten minutes", "this film was a joy from start to finish")


def _fields(handler: Any) -> str:
    return ", ".join(f"{f.name} {f.sql_type.value}" for f in handler.task().fields)


def _session_args(model: Any) -> tuple[list[Any], list[Any]] | None:
    session = getattr(model, "session", None)
    if session is None:
        return None
    return list(session.get_inputs()), list(session.get_outputs())


def _probe(handler: Any, model: Any, name: str) -> list[str]:
    """One line per probe example: its rendered outputs (short)."""
    from pyflink_aisp.errors import ModelError
    from pyflink_aisp.inference.handlers import PredictorModel
    from pyflink_aisp.inference.tasks import render_fields

    if isinstance(model, PredictorModel):
        examples: list[Any] = [[0.0] * (model.n_features or 1)]
    else:
        examples = list(_PROBE_TEXTS)
    try:
        predictions = handler.run_inference(examples, model)
        rendered = [render_fields(handler.task(), p) for p in predictions]
    except Exception as exc:
        raise ModelError(f"model {name}: the probe failed: {type(exc).__name__}: {exc}") from exc
    lines = []
    for example, out in zip(examples, rendered, strict=True):
        shown = {k: ([*v[:3], "..."] if isinstance(v, list) and len(v) > 3 else v) for k, v in out.items()}
        label = repr(example) if isinstance(example, str) else f"zeros({len(example)})"
        lines.append(f"    probe {label} -> {shown}")
    return lines


def _cmd_models(args: argparse.Namespace) -> int:
    from pyflink_aisp.pipeline import describe_route, load_registry, route_plan

    registry = load_registry(args.file)
    print(f"{registry.path}: {len(registry.models)} model(s)")
    for name, entry in registry.models.items():
        handler = entry.handler()
        o = entry.options
        print(f"{name}: {entry.task.value}, {entry.source}, device {o.device}, "
              f"max-batch-size {o.max_batch_size}")
        print(f"    fields: {_fields(handler)}")
        if args.models_command != "check":
            continue
        model = handler.load_model()
        try:
            args_of = _session_args(model)
            if args_of is not None:
                inputs, outputs = args_of
                print("    inputs: " + ", ".join(f"{a.name} {a.type} {a.shape}" for a in inputs))
                print("    outputs: " + ", ".join(f"{a.name} {a.type} {a.shape}" for a in outputs))
            print(f"    version: {handler.model_version()}")
            print("\n".join(_probe(handler, model, name)))
        finally:
            handler.release_model(model)
    for name in registry.routes:
        print(f"route {name}: {describe_route(route_plan(registry, name).node)}")
    return 0


def _cmd_intent_head(args: argparse.Namespace) -> int:
    from pyflink_aisp.models import build_intent_head

    out = build_intent_head(Path(args.out))
    print(f"{out}: embedding float (batch, 384) -> label, probabilities (157 intents); run it with "
          f"--predictor {out}")
    return 0


def _cmd_encoder(args: argparse.Namespace) -> int:
    from pyflink_aisp.models import build_minilm_encoder

    out = build_minilm_encoder(Path(args.out))
    print(f"{out}: model.onnx (embedding float (batch, 384), pooled and normalised), tokenizer.json; run "
          f"it with --encoder-onnx {out}/model.onnx --encoder-tokenizer {out}/tokenizer.json "
          "--encoder-pooling none")
    return 0


def add_model_registry_commands(sub: Any, model: Any) -> None:
    """Add ``models list|check`` to ``sub`` and ``intent-head`` to the ``model`` subparsers."""
    models = sub.add_parser("models", help="the model registry (YAML): list its models, or check them")
    commands = models.add_subparsers(dest="models_command", required=True)
    for command, text in (("list", "each model's task, source, device and output fields"),
                          ("check", "also load every model, show its graph inputs/outputs and run a probe")):
        parser = commands.add_parser(command, help=text + " (exit 1, one line, if one cannot serve)")
        parser.add_argument("file", type=Path, help="the registry file")
        parser.set_defaults(func=_cmd_models)
    head = model.add_parser("intent-head", help="write rag-intent-classifier's logistic regression alone "
                            "as a numeric ONNX model (embedding in, label and probabilities out) for "
                            "--predictor")
    head.add_argument("--out", required=True, help="the .onnx file to write")
    head.set_defaults(func=_cmd_intent_head)
    encoder = model.add_parser("encoder", help="write all-MiniLM-L6-v2 (mean pooling, L2 norm) as an ONNX "
                               "encoder directory for --encoder-onnx")
    encoder.add_argument("--out", required=True, help="the directory to write")
    encoder.set_defaults(func=_cmd_encoder)
