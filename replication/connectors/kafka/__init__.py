"""Kafka, read with kafka-python: the ``replication-kafka`` Spark source and its range reads
(``source``), record-batch decoding (``records``), fetch waits for slow brokers (``fetch_wait``) and
the embedded tansu broker of tests and the demo (``broker``). Needs a Kafka-protocol broker."""
