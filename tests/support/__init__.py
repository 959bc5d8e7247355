"""What the tests share (importable as ``support.<module>``: pytest puts ``tests/`` on the path).

- ``factories``: builders of instance configs (``write_config``, ``destination_xml``, ...) and readers of what a
  user looks at (txlog rows, rejects); ``assert_exactly_once``, ``wait_until``, raw and bulk Kafka publishes.
- ``fabric``: ``TestFabric``, instances in the test session's Spark application, and what drives them
  (publishers at a pace, ack recorders and listeners, ``link_of``).
- ``processes``: ``InstanceProcess``, ``replication run`` in a process of its own (for kill -9 and signals), and
  ``running``, whether an instance's heartbeat is fresh.
- ``cli``: the one way to run the ``replication`` command, in this process or in its own (``run_cli``).
- ``tables``: txlog and inbox Delta tables written as the engine writes them (``TxlogWriter``, ``Upstream``).
- ``streams``: the package's Spark sources run to their end (``run_available_now``), subscriptions collected.
- ``kafka``: unique topics, numbered publishes and options for the Kafka source's tests.
- ``repo``: the repository's root and its shipped mesh configs (``mesh_copy``, an edited copy).
- ``sow_reference``: a plain-Python SOW the engine's SOW is compared with.
"""
