"""Delta tables through deltalake (delta-rs), no Spark jars: idempotent appends (``tables``),
following a table's commit files (``log``), and the ``replication-txlog`` and ``replication-inbox``
Spark streams (``txlog_stream``, ``inbox_stream``)."""
