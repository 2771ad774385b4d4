"""build_pipeline's graph without running it: plan-level assertions on the explained StatementSet
(Kafka source, the Python inference operator, the two exactly-once Kafka sinks), for the Arrow and
the async operator, with a handler the pipeline does not know."""

from __future__ import annotations

import json
import sys

import cloudpickle
import pytest
from pyflink.datastream import StreamExecutionEnvironment

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.inference.tasks import OutputField, SqlType, Task
from pyflink_aisp.kafka import create_topics, list_topics
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline.flink import make_environment, pipeline_statements

pytestmark = pytest.mark.integration


class WordsTask(Task):
    @property
    def fields(self) -> tuple[OutputField, ...]:
        return (OutputField(name="words", sql_type=SqlType.BIGINT),)

    def render(self, prediction: int) -> dict[str, int]:
        return {"words": prediction}


class WordCountHandler(ModelHandler[str, int, None]):
    """A handler the pipeline has never heard of."""

    def load_model(self) -> None:
        return None

    def run_inference(self, batch, model):
        return [len(t.split()) for t in batch]

    def task(self, *, with_embedding: bool = False) -> WordsTask:
        return WordsTask()


class NoTaskHandler(WordCountHandler):
    def task(self, *, with_embedding: bool = False) -> WordsTask:
        return ModelHandler.task(self)  # type: ignore[return-value]


@pytest.fixture(scope="module", autouse=True)
def _pickle_handlers_by_value():
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _sinks(nodes: list[str]) -> bool:
    """``<table>[<id>]: Writer``, then its Committer (a transactional sink), for scores then dlq."""
    names = [n.split("[")[0] + n.split("]")[1] for n in nodes]
    return names == ["scores_out: Writer", "scores_out: Committer", "dlq_out: Writer", "dlq_out: Committer"]


def _options(bootstrap: str, t_in: str, t_out: str, *extra: str) -> PipelineOptions:
    return PipelineOptions.from_args(["--bootstrap-servers", bootstrap, "--input-topic", t_in,
                                      "--output-topic", t_out, "--mode", "batch", *extra])


@pytest.mark.parametrize("operator", ["arrow", "async"])
def test_the_plan_reads_kafka_scores_in_one_python_operator_and_writes_two_kafka_sinks(
    operator, kafka_bootstrap, topic
):
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in])
    options = _options(kafka_bootstrap, t_in, t_out, "--operator", operator)
    t_env = make_environment(options)
    statements = pipeline_statements(t_env, options, WordCountHandler())
    explained = statements.explain().split("== Optimized Execution Plan ==")[1]
    statements.attach_as_datastream()  # the job graph as it would be submitted, not run
    env = StreamExecutionEnvironment(t_env._j_tenv.execEnv())
    nodes = [node["type"] for node in json.loads(env.get_execution_plan())["nodes"]]
    assert nodes[0] == "Source: KafkaSource-default_catalog.default_database.records_in", nodes
    assert _sinks(nodes[-4:]), nodes  # transactional sinks: a committer after each writer
    python = [n for n in nodes if n.startswith("PythonCalc") or n == "decode+tokenize+infer"]
    if operator == "arrow":  # the pandas map: one Python operator, its output reused by both sinks
        assert len(python) == 1 and python[0].startswith("PythonCalc"), nodes
        assert explained.count("PythonCalc(") == 1 and "(reuse_id=[1])" in explained, explained
    else:  # the async operator between the table source and the table sinks
        assert python == ["decode+tokenize+infer"], nodes
        at = nodes.index("decode+tokenize+infer")
        assert (nodes[at - 1], nodes[at + 1]) == ("TableToDataStream", "DataStreamToTable"), nodes
    assert {t_out, f"{t_out}.dlq"} <= set(list_topics(kafka_bootstrap))  # made for the sinks


def test_a_handler_without_a_task_is_refused_before_any_topic_is_made(kafka_bootstrap, topic):
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in])
    options = _options(kafka_bootstrap, t_in, t_out)
    with pytest.raises(ConfigError, match="NoTaskHandler declares no output fields"):
        pipeline_statements(make_environment(options), options, NoTaskHandler())
    assert t_out not in list_topics(kafka_bootstrap)
