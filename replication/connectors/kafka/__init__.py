"""Kafka, read with kafka-python: the ``replication-kafka`` Spark source (``source``), its driver-side
offsets (``offsets``) and its reads of offset ranges (``ranges``: the ingest's small batches), record-batch
decoding (``records``), and the single-node Apache Kafka broker the demo, tests and benchmarks start
(``broker``)."""
