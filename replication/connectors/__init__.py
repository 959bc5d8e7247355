"""The building blocks' plumbing: Kafka (``kafka``), Delta tables (``delta``) and Spark (``spark``).
Nothing here knows AMPS; the concepts on the package's top level use these."""
