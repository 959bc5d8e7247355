# Databricks notebook source
# MAGIC %md
# MAGIC # Replay a topic from a bookmark
# MAGIC
# MAGIC Reads an instance's transaction log back: the messages of a topic after a bookmark (or in a time
# MAGIC range) that match a content filter, in the instance's delivery order (`seq`). Then counts them per
# MAGIC publisher and per minute, types the JSON fields, and resumes from the last bookmark seen, as a
# MAGIC reader that stopped halfway would.
# MAGIC
# MAGIC Parameters (widgets on Databricks; run locally as `python notebooks/replay.py` with environment
# MAGIC variables `REPLICATION_<NAME>`):
# MAGIC
# MAGIC | name | meaning | default |
# MAGIC |---|---|---|
# MAGIC | `config` | the instance's config file, or its storage root | `conf/amps-1.xml` |
# MAGIC | `topic` | topic regex (a plain name matches exactly) | `.*` |
# MAGIC | `filter` | AMPS content filter, e.g. `/qty > 100 AND /side = 'buy'` | none |
# MAGIC | `bookmark` | where to start: `0`, `0\|1\|` (now), a bookmark, a time `YYYYMMDDThhmmss[Z]` or a list | `0` |
# MAGIC | `until` | where to stop, inclusive (same forms) | the end of the log |
# MAGIC | `first` | how many messages the first read takes before resuming | `100` |
# MAGIC
# MAGIC On Databricks, install the `replication` package on the cluster first (e.g. `%pip install` of its wheel).

# COMMAND ----------

from pyspark.sql import functions as F

from replication import replay
from replication.connectors.spark.notebook import Notebook

nb = Notebook.of(globals())
CONFIG = nb.param("config", "conf/amps-1.xml")
TOPIC = nb.param("topic", ".*")
FILTER = nb.param("filter", "") or None
BOOKMARK = nb.param("bookmark", "0")
UNTIL = nb.param("until", "") or None
FIRST = int(nb.param("first", "100"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## The messages
# MAGIC `replay.txlog` returns a DataFrame in `seq` order; the topic regex and the filter run as native
# MAGIC Spark expressions.

# COMMAND ----------

messages = replay.txlog(CONFIG, topic=TOPIC, filter=FILTER, bookmark=BOOKMARK, until=UNTIL, spark=nb.spark)
total = messages.count()
nb.display(messages.select("seq", "bookmark", "publisher", "topic", "persist_time",
                           F.col("data").cast("string").alias("data")),
           title=f"{total} messages on {TOPIC!r} after bookmark {BOOKMARK!r}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Counts per publisher and per minute

# COMMAND ----------

per_publisher = messages.groupBy("publisher").count().orderBy("publisher")
nb.display(per_publisher, title="messages per publisher")
per_minute = (messages.groupBy(F.date_trunc("minute", "persist_time").alias("minute")).count()
              .orderBy("minute"))
nb.display(per_minute, title="messages per minute (persist time, UTC)")

# COMMAND ----------

# MAGIC %md
# MAGIC ## JSON fields as columns
# MAGIC `replay.json_columns` infers the bodies' schema (or takes one) and adds each field as a typed column.

# COMMAND ----------

json_messages = messages.where(F.col("message_type") == "json")
if json_messages.limit(1).count():
    typed = replay.json_columns(json_messages)
    nb.display(typed.drop("data", "fields", "bookmark", "path", "sow_key", "received_from_group"),
               title="typed fields")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Resume from the last bookmark
# MAGIC A reader that took the first messages and stopped passes the last bookmark it saw: the replay
# MAGIC continues exactly after it (with the same topic, filter and end).

# COMMAND ----------

taken = messages.limit(FIRST).collect()
if taken:
    last_bookmark = taken[-1]["bookmark"]
    resumed = replay.txlog(CONFIG, topic=TOPIC, filter=FILTER, bookmark=last_bookmark, until=UNTIL, spark=nb.spark)
    resumed_count = resumed.count()
    print(f"took {len(taken)} messages, the last with bookmark {last_bookmark}; "
          f"resuming after it gives {resumed_count} more ({len(taken) + resumed_count} in all)")
    nb.display(resumed.select("seq", "bookmark", "publisher", "topic"), title="resumed")
