"""Flink's own ``ML_PREDICT`` over a Kafka topic, the baseline case of ``remote_bench.py``.

A Flink SQL job, BATCH runtime mode, a MiniCluster in this process, parallelism 1: a bounded Kafka
source (earliest to latest offset, JSON) into ``ML_PREDICT`` with a model of Flink's own provider
(``flink-model-triton`` on a V2 server, through ``_triton_provider.py``'s repaired factory, whose jar
``--provider-jar`` names; ``flink-model-openai`` on an OpenAI-compatible one), into a
Kafka sink (the id as the key, JSON values, at-least-once: Flink's default). Flink's async
ML_PREDICT sends one request per row, up to ``--max-concurrent`` of them in flight
(``table.exec.async-ml-predict.max-concurrent-operations``, FLIP-525). Run by the bench as a subprocess::

    python bench/_ml_predict_job.py --provider triton --bootstrap-servers H:P --input-topic features \\
        --output-topic out --endpoint http://H:P/v2/models --model intent_head_caps \\
        --provider-jar DIR/triton-schema-checked.jar
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyflink_aisp.jars import JarKind, ensure_jars, pipeline_jars_value

#: per provider: the source's feature column, the model's INPUT and OUTPUT, its WITH options
_MODELS = {
    "triton": ("embedding ARRAY<FLOAT>", "embedding ARRAY<FLOAT>", "label STRING",
               "'provider' = 'triton-schema-checked', 'endpoint' = '{endpoint}', 'model-name' = '{model}'"),
    "openai": ("text STRING", "text STRING", "embedding ARRAY<FLOAT>",
               "'provider' = 'openai', 'endpoint' = '{endpoint}', 'model' = '{model}', "
               "'api-key' = 'unused'"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--provider", choices=sorted(_MODELS), required=True)
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--input-topic", required=True)
    p.add_argument("--output-topic", required=True)
    p.add_argument("--id-field", default="tx", help="the records' id field (a top-level JSON key)")
    p.add_argument("--endpoint", required=True, help="the provider's 'endpoint' option")
    p.add_argument("--model", required=True)
    p.add_argument("--provider-jar", action="append", default=[],
                   help="a jar the provider needs besides Flink's (repeatable)")
    p.add_argument("--max-concurrent", type=int, default=10,
                   help="async ML_PREDICT's requests in flight (Flink's default: 10)")
    return p.parse_args(argv)


def statements(args: argparse.Namespace) -> list[str]:
    """The job's SQL: source, sink, model, and the ``INSERT ... ML_PREDICT``."""
    column, model_in, model_out, options = _MODELS[args.provider]
    feature = column.split()[0]
    out_name, out_type = model_out.split(maxsplit=1)
    kafka = f"'connector' = 'kafka', 'properties.bootstrap.servers' = '{args.bootstrap_servers}'"
    return [
        f"CREATE TABLE src ({args.id_field} STRING, {column}) WITH ({kafka}, "
        f"'topic' = '{args.input_topic}', 'properties.group.id' = 'ml-predict-bench', "
        "'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset', "
        "'format' = 'json', 'json.ignore-parse-errors' = 'false')",
        f"CREATE TABLE snk ({args.id_field} STRING, {out_name} {out_type}) WITH ({kafka}, "
        f"'topic' = '{args.output_topic}', 'key.format' = 'raw', 'key.fields' = '{args.id_field}', "
        "'value.format' = 'json', 'sink.delivery-guarantee' = 'at-least-once')",
        f"CREATE MODEL m INPUT ({model_in}) OUTPUT ({model_out}) WITH "
        f"({options.format(endpoint=args.endpoint, model=args.model)})",
        f"INSERT INTO snk SELECT {args.id_field}, {out_name} FROM ML_PREDICT(TABLE src, MODEL m, "
        f"DESCRIPTOR({feature}))",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the job to its end."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    args = parse_args(argv)
    t_env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    config = t_env.get_config()
    jars = [*ensure_jars(JarKind.FLINK), *ensure_jars(JarKind.FLINK_MODELS), *map(Path, args.provider_jar)]
    config.set("pipeline.jars", pipeline_jars_value(jars))
    config.set("parallelism.default", "1")
    config.set("table.exec.async-ml-predict.max-concurrent-operations", str(args.max_concurrent))
    *ddl, insert = statements(args)
    for sql in ddl:
        t_env.execute_sql(sql)
    t_env.execute_sql(insert).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
