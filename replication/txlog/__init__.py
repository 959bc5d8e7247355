"""The transaction log: an instance's record of every accepted message, once, in ``seq`` order (DESIGN §3).

``schema`` (its columns, and ``rejected/``'s), ``publishers`` (the per-publisher high-water marks the
ingest keeps), ``runs`` (runs of local seqs), ``files`` (its data files by ``seq``, read without Spark),
``seek`` (a bookmark or a time found by file statistics), ``stream`` (the ``replication-txlog`` Spark
source) and ``reader`` (:class:`~replication.txlog.reader.TxlogReader`: positions and rows for replays
and the query commands).
"""
