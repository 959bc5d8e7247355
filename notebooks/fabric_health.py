# Databricks notebook source
# MAGIC %md
# MAGIC # Fabric health
# MAGIC
# MAGIC For a set of instance configs: each instance's positions and durable watermark, each replication
# MAGIC link's sent and acknowledged positions and lag, the messages each instance rejected (by reason), and
# MAGIC the replication latency of each hop, computed from the transaction logs: a row's `persist_time` at
# MAGIC the downstream instance minus its `publish_time` at the origin (end to end from the publisher), and
# MAGIC minus its `persist_time` upstream (this hop alone).
# MAGIC
# MAGIC Parameters (widgets on Databricks; environment variables `REPLICATION_<NAME>` when run locally):
# MAGIC
# MAGIC | name | meaning | default |
# MAGIC |---|---|---|
# MAGIC | `configs` | comma-separated instance config files | `conf/amps-1.xml,conf/amps-2.xml` |
# MAGIC
# MAGIC Locally the chart is saved as `replication_latency.png` in `$REPLICATION_OUTPUT_DIR` (default: here).

# COMMAND ----------

import matplotlib.pyplot as plt
import pandas as pd
from pyspark.sql import functions as F

from replication import config, replay
from replication.commands.status import collect
from replication.connectors.spark.notebook import Notebook

nb = Notebook.of(globals())
CONFIGS = [p.strip() for p in nb.param("configs", "conf/amps-1.xml,conf/amps-2.xml").split(",") if p.strip()]
instances = {cfg.name: cfg for cfg in (config.load(path) for path in CONFIGS)}

# COMMAND ----------

# MAGIC %md
# MAGIC ## Instances and links
# MAGIC `sent` and `acked` are positions in the upstream's `seq`; `durable` is the watermark below which every
# MAGIC row is acknowledged by all sync destinations (what a `fully_durable` replay returns).

# COMMAND ----------

status_rows, link_rows = [], []
for name, cfg in instances.items():
    state = collect(cfg)
    status_rows.append({"instance": name, "alive": state["alive"], "max_seq": state["max_seq"],
                        "durable": replay.open_txlog(cfg).durable_seq(), "error": state["error"] or ""})
    for destination, link in sorted(state["links"].items()):
        link_rows.append({"link": f"{name} -> {destination}", "state": link.get("state", "?"),
                          "sync": "async*" if link.get("downgraded") else link.get("sync_type", ""),
                          "sent": link.get("sent_seq", 0), "acked": link.get("acked_seq", 0),
                          "lag_messages": link.get("lag_messages", 0), "lag_seconds": link.get("lag_seconds", 0.0)})
status = pd.DataFrame(status_rows)
links = pd.DataFrame(link_rows, columns=["link", "state", "sync", "sent", "acked", "lag_messages", "lag_seconds"])
nb.display(status, title="instances")
nb.display(links, title="replication links")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Rejected messages by reason

# COMMAND ----------

rejected_by_reason = None
for name, cfg in instances.items():
    counts = replay.rejected(cfg, spark=nb.spark).groupBy("reason").count().withColumn("instance", F.lit(name))
    rejected_by_reason = counts if rejected_by_reason is None else rejected_by_reason.unionByName(counts)
rejected_by_reason = rejected_by_reason.select("instance", "reason", "count").orderBy("instance", F.desc("count"))
nb.display(rejected_by_reason, title="rejected messages")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Replication latency per hop
# MAGIC For each row an instance received from an upstream: `persist_time` here minus the origin's
# MAGIC `publish_time` (from the publisher to here), and minus the upstream's `persist_time` for the same
# MAGIC bookmark (this hop alone; when the upstream's config is among the given ones).

# COMMAND ----------

def millis(column):
    return F.unix_micros(column) / 1000.0


hops = None
for name, cfg in instances.items():
    received = (replay.txlog(cfg, spark=nb.spark).where(F.col("received_from").isNotNull())
                .select(F.concat_ws(" -> ", "received_from", F.lit(name)).alias("hop"), "received_from", "bookmark",
                        (millis(F.col("persist_time")) - millis(F.col("publish_time"))).alias("from_publish_ms"),
                        F.col("persist_time").alias("here")))
    upstream_logs = [replay.txlog(instances[u], spark=nb.spark).select(F.lit(u).alias("received_from"), "bookmark",
                                                                       F.col("persist_time").alias("upstream"))
                     for u in instances if u != name]
    if upstream_logs:
        upstream = upstream_logs[0]
        for more in upstream_logs[1:]:
            upstream = upstream.unionByName(more)
        received = received.join(upstream, ["received_from", "bookmark"], "left")
    else:
        received = received.withColumn("upstream", F.lit(None).cast("timestamp"))
    hop = received.select("hop", "from_publish_ms", (millis(F.col("here")) - millis(F.col("upstream"))).alias("hop_ms"))
    hops = hop if hops is None else hops.unionByName(hop)

latency = (hops.groupBy("hop").agg(
    F.count("*").alias("messages"),
    F.percentile_approx("from_publish_ms", 0.5).alias("p50_from_publish_ms"),
    F.percentile_approx("from_publish_ms", 0.99).alias("p99_from_publish_ms"),
    F.percentile_approx("hop_ms", 0.5).alias("p50_hop_ms"),
    F.percentile_approx("hop_ms", 0.99).alias("p99_hop_ms"),
).orderBy("hop").toPandas())
nb.display(latency, title="replication latency per hop (ms)")

# COMMAND ----------

figure, axes = plt.subplots(figsize=(7, 1.2 + 0.6 * max(1, len(latency))))
positions = range(len(latency))
axes.barh([p + 0.2 for p in positions], latency["p50_from_publish_ms"], height=0.4, label="p50")
axes.barh([p - 0.2 for p in positions], latency["p99_from_publish_ms"], height=0.4, label="p99")
axes.set_yticks(list(positions), latency["hop"])
axes.set_xlabel("persist_time downstream - publish_time at the origin (ms)")
axes.set_title("Replication latency per hop")
axes.legend(loc="lower right", fontsize="small")
chart = nb.chart(figure, "replication_latency.png")
plt.close(figure)
