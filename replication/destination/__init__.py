"""One outgoing replication link: its thread (``manager``), what it reads of the destination (``resync``),
its query (``replicator``) and its state (``link``)."""
