"""Several brokers as one cluster (Kafka's controller and partition leadership).

* ``membership``: who is in the cluster and who leads what, sans-I/O: the static broker list
  (``pipeline.cluster.brokers``), partition leaders, group coordinators, producer-id
  interleaving, and ``DynamicCluster``, which follows the leadership rows of the database.
* ``service``: ``LeadershipService``, a broker's trio tasks with leadership through the
  database (``pipeline.cluster.leadership = "database"``): registration and heartbeats, the
  controller, taking partitions over and handing them off.

The leadership store itself (the SQL) is ``pipeline.metadata.leadership``, beside the other
metadata stores.
"""
