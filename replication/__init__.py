"""AMPS-style replication of message streams on Spark Structured Streaming, Kafka and Delta Lake."""

__version__ = "0.1.0"
