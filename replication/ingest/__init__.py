"""The ingest query, the txlog's only writer: its inputs as candidate rows (``inputs``), what a batch
becomes (``classify``, pure) and the ``foreachBatch`` that commits it (``writer``)."""
