"""Python clients of an instance: the HA publisher (:class:`Publisher`) and a queue consumer (:class:`QueueConsumer`).

See :mod:`replication.client.publisher` and :mod:`replication.client.queue_consumer`.
"""

from replication.client.publisher import ACK_FETCH_WAIT_MS, FailedMessage, Publisher, PublishStore
from replication.client.queue_consumer import QueueConsumer, QueueMessage

__all__ = ["ACK_FETCH_WAIT_MS", "FailedMessage", "PublishStore", "Publisher", "QueueConsumer", "QueueMessage"]
