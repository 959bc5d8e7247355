"""Kafka, read with kafka-python: the ``replication-kafka`` Spark source and its range reads
(``source``), record-batch decoding (``records``), and the single-node Apache Kafka broker the demo,
tests and benchmarks start (``broker``)."""
