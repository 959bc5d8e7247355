"""Queues (``<SOW><Queue>``, ``<GroupLocalQueue>``, ``<LocalQueue>``): each message processed by one consumer.

A queue's messages are the txlog rows of its underlying topics; its
acknowledgements are ``sow_delete`` rows on the queue topic carrying the
bookmarks they remove. Both are ordinary txlog rows, so a queue replicates,
replays and survives a crash like every other topic, and its state on an
instance is a fold of that instance's txlog (:mod:`.state`).

The wire format (:mod:`.wire`): a consumer subscribes with a ``subscribe``
record on the instance's publish topic, receives deliveries on the Kafka
topic ``<instance>.deliveries``, and acknowledges with a ``sow_delete`` on the
queue topic whose body is the bookmarks. :mod:`.dispatcher` runs the
deliveries in the instance; ``replication.client.QueueConsumer`` is the
consumer's side.

Ownership follows the spec: the instance that first received the publish owns a
``<Queue>`` message, the ``<InitialOwner>`` a ``<GroupLocalQueue>`` message, and
only the owner delivers it.
"""
