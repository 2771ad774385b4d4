"""The packaged jobs, shipped inside the package (``flink run -pym pyflink_aisp.jobs.NAME``).

:mod:`pyflink_aisp.jobs.review_sentiment`: Kafka → decode (DLQ) → tokenize + batched
inference → Kafka, exactly once; every flag a row of the options table.
"""
