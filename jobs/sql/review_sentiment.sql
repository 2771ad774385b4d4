-- Review sentiment in Flink SQL: Kafka (JSON reviews) -> sentiment(text) -> Kafka, exactly once.
--
-- The SQL version of jobs/review_sentiment.py. Reads {"id", "text", ...} from topic `reviews`,
-- scores each text with the batched `sentiment` Python function (pyflink_aisp.pipeline.sql,
-- one ONNX Runtime model per Python worker) and writes {"id", "label", "score", "model_sha256"}
-- to `scores-sql`, keyed by id; rows without a text (absent, null or not a string) and rows
-- whose inference failed go to `scores-sql.dlq` with the reason and their Kafka coordinates.
--
-- Run it on the local stack (`aisp local up`, then `aisp ingest --topic reviews`) in one command:
--
--   .venv/bin/aisp sql jobs/sql/review_sentiment.sql
--
-- (Flink's SQL client with the cluster's FLINK_CONF_DIR, the Kafka connector, flink-python and SQL
-- gateway jars, and the venv's Python for the client and the workers; it prints the job id.
-- `aisp sql` with no file opens an interactive session against the same cluster.)
--
-- The SQL client submits the job to the local cluster and returns; stop it with
-- `aisp local flink stop JOB_ID`. Other topics or broker: edit the WITH clauses below.
-- BATCH instead of STREAMING: set 'execution.runtime-mode' to 'batch' and add
-- 'scan.bounded.mode' = 'latest-offset' to the source (it then reads up to the offsets at start).
--
-- Differences from the Python job: a record that is not JSON is skipped by Flink's JSON format
-- ('json.ignore-parse-errors'), not dead-lettered; a record with a missing or non-string text
-- becomes a `missing_text` dead letter; no --with-embedding.

SET 'execution.runtime-mode' = 'streaming';
SET 'execution.checkpointing.interval' = '5 s';
SET 'parallelism.default' = '1';

-- What the function loads and how it batches (global job parameters, read in the Python worker;
-- all optional, names and defaults in the README's options table): the model (default: the cached
-- build), batches of up to 64 texts waiting at most 5 ms, ONNX Runtime's default threads, no p99 target.
SET 'pipeline.global-job-parameters' = '{"aisp.batch.max-size": "64", "aisp.batch.max-wait-ms": "5"}';

-- pyflink_aisp.pipeline.flink_settings(PipelineOptions(max_batch_size=64, max_wait_ms=5)), as a test
-- checks: results leave the Python worker when a bundle ends (50 ms without a latency target);
-- the async function keeps at most 2 x 64 rows in flight (its default of 10 caps batches at 10);
-- the pandas variant gets Arrow batches of up to 1024 rows, cut into model batches of 64.
-- A record that fails the job every time (or a model the circuit breaker stops) must not restart it
-- without end, and a TaskManager being replaced must not spend the budget: exponential-delay, the
-- wait 5 s doubling to 60 s, at most 10 restarts until the job has run 10 min without failure
-- (decision record 5). A checkpoint not done in 10 min is declined; the sink's transactions (1 h)
-- outlive two checkpoint spans and the longest restart wait.
SET 'execution.checkpointing.timeout' = '600000 ms';
SET 'restart-strategy.type' = 'exponential-delay';
SET 'restart-strategy.exponential-delay.initial-backoff' = '5 s';
SET 'restart-strategy.exponential-delay.max-backoff' = '60 s';
SET 'restart-strategy.exponential-delay.backoff-multiplier' = '2.0';
SET 'restart-strategy.exponential-delay.jitter-factor' = '0.1';
SET 'restart-strategy.exponential-delay.reset-backoff-threshold' = '600 s';
SET 'restart-strategy.exponential-delay.attempts-before-reset-backoff' = '10';
SET 'python.fn-execution.bundle.time' = '50';
SET 'python.fn-execution.bundle.size' = '4096';
SET 'python.fn-execution.arrow.batch.size' = '1024';
SET 'table.exec.async-scalar.max-concurrent-operations' = '128';
SET 'table.exec.async-scalar.timeout' = '600000 ms';
SET 'table.exec.async-scalar.retry-strategy' = 'NO_RETRY';

CREATE TEMPORARY TABLE reviews (
  `id` STRING,
  `text` STRING,
  `topic` STRING METADATA VIRTUAL,
  `partition` INT METADATA VIRTUAL,
  `offset` BIGINT METADATA VIRTUAL
) WITH (
  'connector' = 'kafka',
  'topic' = 'reviews',
  'properties.bootstrap.servers' = '127.0.0.1:9092',
  'properties.group.id' = 'aisp-sql-reviews',
  'properties.isolation.level' = 'read_committed',
  'properties.auto.offset.reset' = 'earliest',
  'scan.startup.mode' = 'group-offsets',
  'format' = 'json',
  'json.ignore-parse-errors' = 'true'
);

-- One sink for scores and dead letters: its `topic` metadata column picks the topic of each
-- record, one of the listed topics.
-- (Two INSERTs reading one view would each get their own copy of the Python call: Flink plans
-- one PythonAsyncCalc per sink, as the columns each needs differ, and scores every row twice.)
CREATE TEMPORARY TABLE outputs (
  `topic` STRING METADATA,
  `key` STRING,
  `value` STRING
) WITH (
  'connector' = 'kafka',
  'topic' = 'scores-sql;scores-sql.dlq',
  'properties.bootstrap.servers' = '127.0.0.1:9092',
  'key.format' = 'raw',
  'key.fields' = 'key',
  'value.format' = 'raw',
  'value.fields-include' = 'EXCEPT_KEY',
  'sink.delivery-guarantee' = 'exactly-once',
  'sink.transactional-id-prefix' = 'aisp-sql-review-sentiment',
  'properties.transaction.timeout.ms' = '3600000'
);

CREATE TEMPORARY SYSTEM FUNCTION sentiment AS 'pyflink_aisp.pipeline.sql.sentiment' LANGUAGE PYTHON;

INSERT INTO outputs
SELECT
  CASE WHEN s.score IS NOT NULL THEN 'scores-sql' ELSE 'scores-sql.dlq' END,
  `id`,
  CASE
    WHEN s.score IS NOT NULL THEN JSON_OBJECT(
      KEY 'id' VALUE `id`, KEY 'label' VALUE s.label, KEY 'score' VALUE s.score,
      KEY 'model_sha256' VALUE s.model_sha256)
    -- else the pipeline's dead letter (README "Dead letters"); raw values are not kept here
    ELSE JSON_OBJECT(
      KEY 'reason' VALUE COALESCE(s.reason, 'missing_text'),
      KEY 'detail' VALUE COALESCE(s.detail, 'no string "text" field'),
      KEY 'id' VALUE `id`, KEY 'topic' VALUE in_topic, KEY 'partition' VALUE `partition`,
      KEY 'offset' VALUE `offset`, KEY 'value_base64' VALUE CAST(NULL AS STRING),
      KEY 'value_size_bytes' VALUE CAST(NULL AS INT), KEY 'value_truncated' VALUE FALSE)
  END
FROM (
  SELECT `id`, `text`, `topic` AS in_topic, `partition`, `offset`, sentiment(`text`) AS s
  FROM reviews
);
