# Databricks notebook source
# MAGIC %md
# MAGIC # State of the World: current records, a query, the history of one key
# MAGIC
# MAGIC A SOW topic keeps the current message per key. This notebook shows the current records of a SOW
# MAGIC topic, the records matching a content filter, and, from the transaction log, every message that
# MAGIC ever touched one key (how the record came to be what it is).
# MAGIC
# MAGIC Parameters (widgets on Databricks; environment variables `REPLICATION_<NAME>` when run locally):
# MAGIC
# MAGIC | name | meaning | default |
# MAGIC |---|---|---|
# MAGIC | `config` | the instance's config file, or its storage root | `conf/amps-1.xml` |
# MAGIC | `topic` | the SOW topic | `/orders` |
# MAGIC | `filter` | AMPS content filter for the query | `/qty > 100` |
# MAGIC | `key_field` | the topic's key field (its `<Key>`) | `/id` |
# MAGIC | `key` | the key whose history to show | `1` |

# COMMAND ----------

from pyspark.sql import functions as F

from replication import replay
from replication.connectors.spark.notebook import Notebook
from replication.errors import ReplicationError

nb = Notebook.of(globals())
CONFIG = nb.param("config", "conf/amps-1.xml")
TOPIC = nb.param("topic", "/orders")
FILTER = nb.param("filter", "/qty > 100")
KEY_FIELD = nb.param("key_field", "/id")
KEY = nb.param("key", "1")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Current records

# COMMAND ----------

sow_error = None
try:
    current = replay.sow(CONFIG, topic=TOPIC, spark=nb.spark)
    nb.display(current, title=f"current records of {TOPIC}")
except ReplicationError as exc:  # an instance without this SOW table says why
    sow_error = str(exc)
    print(f"SOW of {TOPIC}: {exc}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## A query: the records that match a filter

# COMMAND ----------

try:
    matching = replay.sow(CONFIG, topic=TOPIC, filter=FILTER, spark=nb.spark)
    nb.display(matching, title=f"records of {TOPIC} where {FILTER}")
except ReplicationError as exc:
    print(f"SOW query {FILTER!r}: {exc}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The history of one key, from the transaction log
# MAGIC Every message of the topic whose key field has this value, in the order the instance stored them.

# COMMAND ----------

key_literal = "'" + KEY.replace("'", "\\'") + "'"  # a string literal compares with numbers too (AMPS rules)
history = replay.txlog(CONFIG, topic=TOPIC, filter=f"{KEY_FIELD} = {key_literal}", spark=nb.spark)
nb.display(history.select("seq", "persist_time", "publisher", "command", F.col("data").cast("string").alias("data")),
           title=f"history of {KEY_FIELD} = {KEY} on {TOPIC} ({history.count()} messages)")
