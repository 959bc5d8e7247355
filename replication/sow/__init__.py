"""State of the World: the current message per key of the SOW topics, derived from the txlog.

``keys`` (which SOW topic a message belongs to, its key), ``merge``
(delta_publish), ``state`` (the records in the driver, and what an ingest
batch does to them), ``table`` (the Delta table per SOW topic: compacted base
plus txlog, compaction, the exact read) and ``compactor`` (the thread that
keeps the tables up to date).
"""
