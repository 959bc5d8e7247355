"""Spark process plumbing: the shared session (``session``), a checkpoint filesystem without forked
chmods (``local_fs``), Python workers that skip PySpark's zip (``worker_python``), small batches read
in the driver: in Spark's planner (``driver_read``) or by the writer itself (``planned_batch``), and the
trigger interval's syntax (``trigger``)."""
