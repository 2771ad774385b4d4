-- Two tasks, three named models, one SQL job: Kafka tickets -> intent(text) and
-- intent_head(minilm(text).embedding) -> Kafka, exactly once.
--
-- The models come from the registry jobs/sql/models.yaml (how to write them is at its top); each is
-- a function registered by name, without Python. Run it on the local stack (`aisp local up`, a topic
-- `tickets` of JSON {"id", "text"}):
--
--   .venv/bin/aisp sql --models jobs/sql/models.yaml jobs/sql/intent_registry.sql
--
-- `intent` (classify) scores the text with the 157-intent classifier; `minilm` (embed) gives the
-- text's all-MiniLM-L6-v2 embedding, ARRAY<FLOAT>; `intent_head` (predict) runs the classifier's
-- logistic regression alone on that array, so its label equals intent's: a cascade of two models
-- checked against the fused one. Each function has its own model and batcher in the Python worker.
-- Rows whose text is missing or whose inference failed go to `tickets-intent.dlq`.

SET 'execution.runtime-mode' = 'streaming';
SET 'execution.checkpointing.interval' = '5 s';
SET 'parallelism.default' = '1';
-- pyflink_aisp.pipeline.flink_settings(PipelineOptions(max_batch_size=64)): see review_sentiment.sql
SET 'restart-strategy.type' = 'exponential-delay';
SET 'restart-strategy.exponential-delay.initial-backoff' = '5 s';
SET 'restart-strategy.exponential-delay.max-backoff' = '60 s';
SET 'restart-strategy.exponential-delay.attempts-before-reset-backoff' = '10';
SET 'python.fn-execution.bundle.time' = '50';
SET 'python.fn-execution.bundle.size' = '4096';
SET 'python.fn-execution.arrow.batch.size' = '1024';
SET 'table.exec.async-scalar.max-concurrent-operations' = '128';
SET 'table.exec.async-scalar.timeout' = '600000 ms';
SET 'table.exec.async-scalar.retry-strategy' = 'NO_RETRY';

CREATE TEMPORARY TABLE tickets (
  `id` STRING,
  `text` STRING,
  `topic` STRING METADATA VIRTUAL,
  `partition` INT METADATA VIRTUAL,
  `offset` BIGINT METADATA VIRTUAL
) WITH (
  'connector' = 'kafka',
  'topic' = 'tickets',
  'properties.bootstrap.servers' = '127.0.0.1:9092',
  'properties.group.id' = 'aisp-sql-tickets',
  'properties.isolation.level' = 'read_committed',
  'properties.auto.offset.reset' = 'earliest',
  'scan.startup.mode' = 'group-offsets',
  'format' = 'json',
  'json.ignore-parse-errors' = 'true'
);

CREATE TEMPORARY TABLE outputs (
  `topic` STRING METADATA,
  `key` STRING,
  `value` STRING
) WITH (
  'connector' = 'kafka',
  'topic' = 'tickets-intent;tickets-intent.dlq',
  'properties.bootstrap.servers' = '127.0.0.1:9092',
  'key.format' = 'raw',
  'key.fields' = 'key',
  'value.format' = 'raw',
  'value.fields-include' = 'EXCEPT_KEY',
  'sink.delivery-guarantee' = 'exactly-once',
  'sink.transactional-id-prefix' = 'aisp-sql-intent-registry',
  'properties.transaction.timeout.ms' = '3600000'
);

CREATE TEMPORARY SYSTEM FUNCTION intent AS 'pyflink_aisp.pipeline.registry.intent' LANGUAGE PYTHON;
CREATE TEMPORARY SYSTEM FUNCTION minilm AS 'pyflink_aisp.pipeline.registry.minilm' LANGUAGE PYTHON;
CREATE TEMPORARY SYSTEM FUNCTION intent_head AS 'pyflink_aisp.pipeline.registry.intent_head_pandas' LANGUAGE PYTHON;

INSERT INTO outputs
SELECT
  CASE WHEN ok THEN 'tickets-intent' ELSE 'tickets-intent.dlq' END,
  `id`,
  CASE
    WHEN ok THEN JSON_OBJECT(
      KEY 'id' VALUE `id`, KEY 'label' VALUE i.label, KEY 'score' VALUE i.score,
      KEY 'top_labels' VALUE i.top_labels, KEY 'head_label' VALUE h.label,
      KEY 'head_probabilities' VALUE h.probabilities,
      KEY 'model_sha256' VALUE i.model_sha256, KEY 'head_model_sha256' VALUE h.model_sha256)
    ELSE JSON_OBJECT(
      KEY 'reason' VALUE COALESCE(i.reason, e.reason, h.reason, 'missing_text'),
      KEY 'detail' VALUE COALESCE(i.detail, e.detail, h.detail, 'no string "text" field'),
      KEY 'id' VALUE `id`, KEY 'topic' VALUE in_topic, KEY 'partition' VALUE `partition`,
      KEY 'offset' VALUE `offset`)
  END
FROM (
  SELECT *, (i.label IS NOT NULL AND h.label IS NOT NULL) AS ok
  FROM (
    SELECT `id`, in_topic, `partition`, `offset`, i, e, intent_head(e.embedding) AS h
    FROM (
      SELECT `id`, `topic` AS in_topic, `partition`, `offset`, intent(`text`) AS i, minilm(`text`) AS e
      FROM tickets
    )
  )
);
