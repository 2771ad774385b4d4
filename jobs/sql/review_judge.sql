-- A generation task in SQL: Kafka reviews -> judge(body) -> Kafka, exactly once. `judge` is a chat
-- model on an OpenAI-compatible server, from the registry jobs/sql/llm_models.yaml; it answers JSON of
-- jobs/sql/judge.schema.json, parsed into the result's `sentiment` field. Run it on the local stack
-- (`aisp local up`, a topic `reviews` of JSON {"review_id", "body", "lang"}, a server at the
-- registry's remote-url):
--
--   .venv/bin/aisp sql --models jobs/sql/llm_models.yaml jobs/sql/review_judge.sql
--
-- `judge` is the async function: one request per row (chat takes one conversation), many rows in
-- flight. A row whose completion is not JSON of the schema has reason 'invalid_model_output'; it
-- goes, like a row without a body, to `reviews-judged.dlq`.

SET 'execution.runtime-mode' = 'streaming';
SET 'execution.checkpointing.interval' = '5 s';
SET 'parallelism.default' = '1';
-- pyflink_aisp.pipeline.flink_settings(PipelineOptions()): see review_sentiment.sql
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

CREATE TEMPORARY TABLE reviews (
  `review_id` STRING,
  `body` STRING,
  `lang` STRING,
  `topic` STRING METADATA VIRTUAL,
  `partition` INT METADATA VIRTUAL,
  `offset` BIGINT METADATA VIRTUAL
) WITH (
  'connector' = 'kafka',
  'topic' = 'reviews',
  'properties.bootstrap.servers' = '127.0.0.1:9092',
  'properties.group.id' = 'aisp-sql-review-judge',
  'properties.isolation.level' = 'read_committed',
  'properties.auto.offset.reset' = 'earliest',
  'scan.startup.mode' = 'group-offsets',
  'format' = 'json',
  'json.ignore-parse-errors' = 'true'
);

CREATE TEMPORARY TABLE judged (
  `topic` STRING METADATA,
  `key` STRING,
  `value` STRING
) WITH (
  'connector' = 'kafka',
  'topic' = 'reviews-judged;reviews-judged.dlq',
  'properties.bootstrap.servers' = '127.0.0.1:9092',
  'key.format' = 'raw',
  'key.fields' = 'key',
  'value.format' = 'raw',
  'value.fields-include' = 'EXCEPT_KEY',
  'sink.delivery-guarantee' = 'exactly-once',
  'sink.transactional-id-prefix' = 'aisp-sql-review-judge',
  'properties.transaction.timeout.ms' = '3600000'
);

CREATE TEMPORARY SYSTEM FUNCTION judge AS 'pyflink_aisp.pipeline.registry.judge' LANGUAGE PYTHON;

INSERT INTO judged
SELECT
  CASE WHEN j.reason IS NULL AND j.completion IS NOT NULL THEN 'reviews-judged' ELSE 'reviews-judged.dlq' END,
  `review_id`,
  CASE
    WHEN j.reason IS NULL AND j.completion IS NOT NULL THEN JSON_OBJECT(
      KEY 'id' VALUE `review_id`, KEY 'lang' VALUE `lang`, KEY 'sentiment' VALUE j.sentiment,
      KEY 'completion' VALUE j.completion, KEY 'finish_reason' VALUE j.finish_reason,
      KEY 'prompt_tokens' VALUE j.prompt_tokens, KEY 'completion_tokens' VALUE j.completion_tokens,
      KEY 'model_sha256' VALUE j.model_sha256)
    ELSE JSON_OBJECT(
      KEY 'reason' VALUE COALESCE(j.reason, 'missing_text'),
      KEY 'detail' VALUE COALESCE(j.detail, 'no string "body" field'),
      KEY 'id' VALUE `review_id`, KEY 'topic' VALUE in_topic, KEY 'partition' VALUE `partition`,
      KEY 'offset' VALUE `offset`)
  END
FROM (
  SELECT `review_id`, `lang`, `topic` AS in_topic, `partition`, `offset`, judge(`body`) AS j FROM reviews
);
