"""``aisp``: the command line of pyflink-aisp.

Subcommands: ``local up|down|status`` (embedded Kafka broker + Flink cluster),
``affinity serve|topology|leases`` (GPU affinity side service),
``model build|publish|intent-classifier|intent-head|check``, ``models list|check`` (the
model registry), ``ingest`` (real reviews → Kafka), ``verify`` (two runs'
outputs or manifests agree), ``backfill`` (re-score up to a stream's checkpoint),
``demo`` (the main job end to end), ``package`` (the job for a cluster without the
venv), ``sql`` (Flink SQL on the local cluster). Exit status 0 on success, 1 on
a pyflink-aisp error (printed), 2 on bad usage, 3 when ``verify`` finds a difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pyflink_aisp.errors import AispError, ConfigError

__all__ = ["build_parser", "main"]


def _cmd_model_build(args: argparse.Namespace) -> int:
    from pyflink_aisp.models import build_main

    return build_main(["--cache-dir", str(args.cache_dir)] if args.cache_dir else [])


def _cmd_model_intent(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pyflink_aisp.models import build_intent_classifier

    out = build_intent_classifier(Path(args.out))
    labels = len(json.loads((out / "config.json").read_text(encoding="utf-8"))["id2label"])
    print(f"{out}: model.onnx, tokenizer.json, config.json ({labels} labels); run it with --classifier {out}")
    return 0


#: Texts the classifier check scores (written for it).
_PROBE_TEXTS = ("set a timer for ten minutes", "this film was a joy from start to finish")


def _cmd_model_check(args: argparse.Namespace) -> int:
    from pyflink_aisp.inference.handlers import OnnxClassifierHandler

    handler = OnnxClassifierHandler(model_dir=args.directory, top_k=3)
    model = handler.load_model()  # the graph's inputs, output and label axis are checked here
    inputs = ", ".join(f"{a.name} {a.type} {a.shape}" for a in model.session.get_inputs())
    output = next(a for a in model.session.get_outputs() if a.name == model.output)
    labels = handler.labels
    print(f"{args.directory}: classifier, {len(labels)} labels ({', '.join(labels[:5])}"
          f"{', ...' if len(labels) > 5 else ''})")
    print(f"inputs:  {inputs}")
    print(f"output:  {output.name} {output.type} {output.shape}")
    print(f"fields:  {', '.join(f'{f.name} {f.sql_type.value}' for f in handler.task().fields)}")
    print(f"version: {handler.model_version()}")
    scored = handler.run_inference(list(_PROBE_TEXTS), model)
    for text, probabilities in zip(_PROBE_TEXTS, scored, strict=True):
        top = handler.task().render(probabilities)
        print(f"probe:   {text!r} -> {top['label']} {top['score']:.4f}")
    return 0


def _cmd_model_publish(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pyflink_aisp.inference import publish_model

    pointer = publish_model(Path(args.pointer), Path(args.model))
    print(f"published {pointer.path} sha256 {pointer.sha256} -> {args.pointer}")
    return 0


def _cmd_ingest(args: argparse.Namespace) -> int:
    from pyflink_aisp.datasets import load_rotten_tomatoes
    from pyflink_aisp.kafka import create_topics, default_bootstrap_servers, ingest_records

    bootstrap = default_bootstrap_servers(args.bootstrap_servers)
    reviews = load_rotten_tomatoes()[: args.limit]
    for info in create_topics(bootstrap, [args.topic], partitions=args.partitions,
                              replication_factor=args.replication_factor):
        print(f"{'created' if info.created else 'existing'} topic {info.name} "
              f"({info.partitions} partitions, replication factor {info.replication_factor})")
    names = {1: "fresh", 0: "rotten"}
    records = ({"id": r.id, "text": r.text, "label": names[r.label]} for r in reviews)
    result = ingest_records(bootstrap, args.topic, records, total=len(reviews),
                            progress=not args.no_progress)
    print(f"delivered {result.delivered} failed {result.failed} topic {result.topic}")
    if result.first_error:
        print(f"first error: {result.first_error}", file=sys.stderr)
    return 0 if result.failed == 0 else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pyflink_aisp.alignment import compare_outputs
    from pyflink_aisp.kafka import default_bootstrap_servers, read_topic

    bootstrap = default_bootstrap_servers(args.bootstrap_servers)
    if args.manifest or not args.topic_b:
        if len(args.manifest or ()) != 2 or args.topic_a:
            raise ConfigError("verify takes two output topics, or --manifest A --manifest B")
        if args.scored_by is not None:
            raise ConfigError("--scored-by compares output topics (a route's, and its model's alone), "
                              "not manifests: their ranges and counts cover every kind of record")
        from pyflink_aisp.alignment import verify_manifests

        ok, lines = verify_manifests(Path(args.manifest[0]), Path(args.manifest[1]), servers=bootstrap,
                                     tolerance=args.tolerance)
        print("\n".join(lines))
        return 0 if ok else 3
    a, b = ([bytes(m.value() or b"") for m in read_topic(bootstrap, topic, timeout_s=args.timeout_s,
                                                          quiet_s=args.quiet_s)]
            for topic in (args.topic_a, args.topic_b))
    print(f"verify {args.topic_a} (a) against {args.topic_b} (b), committed records only")
    if args.scored_by is not None:
        from pyflink_aisp.alignment import select_scored_by

        selection = select_scored_by(a, b, args.scored_by)
        print(selection.line())
        a, b = selection.a, selection.b
    report = compare_outputs(a, b, tolerance=args.tolerance)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 3


def _tolerance(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _cmd_demo(args: argparse.Namespace) -> int:
    from pyflink_aisp.cli._demo import run_demo

    r = run_demo(runner=args.runner, keep_stack=args.keep_stack)
    ok = r.processed == r.ingested and r.dlq == 0
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    """The ``aisp`` argument parser."""
    from pyflink_aisp.affinity import add_affinity_commands
    from pyflink_aisp.cli._alignment import add_alignment_commands
    from pyflink_aisp.deploy import add_container_commands, add_deploy_commands
    from pyflink_aisp.local import add_local_commands

    parser = argparse.ArgumentParser(prog="aisp", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_local_commands(sub)
    add_container_commands(sub)
    add_deploy_commands(sub)
    add_affinity_commands(sub)
    add_alignment_commands(sub)

    model = sub.add_parser("model", help="model assets").add_subparsers(dest="model_command", required=True)
    build = model.add_parser("build", help="export MiniLM to ONNX, train the head, cache with sha256")
    build.add_argument("--cache-dir", default=None)
    build.set_defaults(func=_cmd_model_build)
    intent = model.add_parser("intent-classifier", help="write rag-intent-classifier's 157-intent "
                              "model (on MiniLM) as a HF classifier directory for --classifier")
    intent.add_argument("--out", required=True, help="the directory to write")
    intent.set_defaults(func=_cmd_model_intent)
    check = model.add_parser("check", help="load a --classifier directory, show its labels, inputs, "
                             "output and fields, and score two probe texts (exit 1, one line, if it "
                             "cannot serve)")
    check.add_argument("directory", type=Path, help="the HF sequence-classification model directory")
    check.set_defaults(func=_cmd_model_check)
    from pyflink_aisp.cli._models import add_model_registry_commands

    add_model_registry_commands(sub, model)
    publish = model.add_parser("publish", help="hot swap: point a running job's --model-pointer file "
                                               "at a new model file (sha256 computed, atomic replace)")
    publish.add_argument("pointer", help="the pointer JSON file the job watches")
    publish.add_argument("model", help="the new model file (e.g. model.onnx)")
    publish.set_defaults(func=_cmd_model_publish)

    ingest = sub.add_parser("ingest", help="write the Rotten Tomatoes reviews to a Kafka topic as JSON")
    ingest.add_argument("--bootstrap-servers", default=None,
                        help="default: $AISP_KAFKA_BOOTSTRAP, else 127.0.0.1:$AISP_KAFKA_PORT (9092)")
    ingest.add_argument("--topic", required=True)
    ingest.add_argument("--limit", type=_non_negative, default=None, help="first N reviews only")
    ingest.add_argument("--partitions", type=_positive, default=None,
                        help="partitions if the topic is created (default: the broker's num.partitions)")
    ingest.add_argument("--replication-factor", type=_positive, default=None,
                        help="replication factor if the topic is created "
                             "(default: the broker's default.replication.factor)")
    ingest.add_argument("--no-progress", action="store_true")
    ingest.set_defaults(func=_cmd_ingest)

    verify = sub.add_parser("verify", help="compare two runs, by their output topics or their manifests "
                                           "(exit 3 when they differ)")
    verify.add_argument("topic_a", nargs="?", help="output topic of one run (e.g. the stream)")
    verify.add_argument("topic_b", nargs="?", help="output topic of the other (e.g. a batch backfill)")
    verify.add_argument("--manifest", action="append", metavar="PATH",
                        help="a run manifest (give two): ranges, counts and digests, then per id")
    verify.add_argument("--bootstrap-servers", default=None,
                        help="default: $AISP_KAFKA_BOOTSTRAP, else 127.0.0.1:$AISP_KAFKA_PORT (9092)")
    verify.add_argument("--tolerance", type=_tolerance, default=1e-5,
                        help="largest accepted |score difference| (default 1e-5)")
    verify.add_argument("--scored-by", default=None, metavar="MODEL",
                        help="a route's run against MODEL's alone: keep a's records that MODEL answered "
                             "(last in their scored_by) and b's of the same ids")
    verify.add_argument("--timeout-s", type=float, default=60.0, help="longest read of each topic")
    verify.add_argument("--quiet-s", type=float, default=3.0,
                        help="a topic is read to its end once no record came for this long")
    verify.set_defaults(func=_cmd_verify)

    demo = sub.add_parser("demo", help="the main job on all reviews, on the local stack")
    demo.add_argument("--runner", choices=["cluster", "local"], default="cluster",
                      help="cluster: flink run on the standalone cluster; local: MiniCluster")
    demo.add_argument("--keep-stack", action="store_true", help="leave the stack running")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``aisp``; returns the exit status."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    takes_rest = getattr(args, "takes_rest", False)
    if rest and not takes_rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(args.func(args, rest) if takes_rest else args.func(args))
    except AispError as exc:
        print(f"aisp: error: {exc}", file=sys.stderr)
        return 1

