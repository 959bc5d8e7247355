"""The inbox: the Delta table upstream instances (and backfills) append to, which the ingest query reads.

``schema`` (its columns and creation), ``versions`` (reading it by Delta version without Spark),
``stream`` (the ``replication-inbox`` Spark source), ``read_ahead`` (the ingest writer reading the next
batch's versions while it writes this one) and ``staged_parts`` (backfill parts staged beside it as
txlog files, stored by the ingest without a rewrite).
"""
