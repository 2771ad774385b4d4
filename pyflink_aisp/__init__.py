"""pyflink-aisp: batched model inference inside PyFlink jobs, Kafka in and out."""

__version__ = "0.1.0"
