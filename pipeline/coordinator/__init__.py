"""The consumer group coordinator: Kafka's classic group protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup), committed offsets, group admin.

* ``metadata``: one group's members and state (Kafka GroupMetadata, MemberMetadata), sans-I/O.
* ``coordinator``: the rules of the protocol (Kafka GroupCoordinator), sans-I/O: time is an
  argument, delayed JoinGroup/SyncGroup answers are returned as replies for opaque waiters.
* ``offset_store``: committed offsets in SQLite (``DATA_DIR/_pipeline/groups.db``), blocking calls.
* ``service``: the trio side: api handlers for ``KafkaApis.register``, the timer task, the offset writer.
"""
