"""Why the brokers of a cluster hold ``DATA_DIR/_pipeline/table.lock`` around every table change.

The brokers of ``pipeline serve --brokers N`` write through one Spark Connect server
(``SparkGroupSink(remote=..., shared_table=True)``, ``pipeline.cli``). All of its sessions are one
Spark application, whose jobs appending to one table share the table directory's ``_temporary``
staging directory (Hadoop FileOutputCommitter): the first job to commit deletes it under the other,
whose tasks then fail (TASK_WRITE_FAILED, ``chmod: cannot access .../_temporary/...``).

Two sinks on one data directory append at once from two threads, as two brokers do: with
``shared_table=True`` every append lands once. The failure without the lock is a race this test
does not reproduce reliably (see the test's closing comment).
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from pipeline.persist.batch import PartitionAppend
from pipeline.persist.group_sink import SparkGroupSink
from pipeline.table.catalog import TableConfig
from tests.conftest import unique_database
from tests.e2e import raw_client as rc

ROWS = 300  # records per append


def concurrent_appends(url: str, data_dir, *, shared_table: bool, rounds: int) -> tuple[list[str], Counter]:
    """Two sinks (two Connect sessions, as two brokers have) append one flush each in turn, then
    ``rounds`` flushes each at once, to topics ``t0`` and ``t1``.

    Returns: the appends' failures (first lines), and (topic, offset) -> rows in the table."""
    config = TableConfig(database=unique_database())
    sinks = [SparkGroupSink(data_dir, remote=url, table_config=config, decode_in_subprocess=False,
                            state_dir=data_dir / f"broker-{i}", shared_table=shared_table) for i in range(2)]
    failures: list[str] = []
    start = threading.Barrier(2, timeout=120)

    def flush(i: int, r: int):
        records = rc.record_batch([b"%d-%d" % (r, n) for n in range(ROWS)])
        return sinks[i].to_table([PartitionAppend(f"t{i}", 0, r * ROWS, records, ROWS, 0)])

    def append(i: int) -> None:
        start.wait()
        for r in range(1, rounds + 1):
            try:
                sinks[i].write(flush(i, r))
            except Exception as exc:  # noqa: BLE001 - collected and asserted by the caller
                failures.append(str(exc).splitlines()[0] if str(exc) else repr(exc))

    started: list[SparkGroupSink] = []
    try:
        for sink in sinks:  # one after the other: a broker creates the tables under the lock
            sink.start()
            started.append(sink)
        for i, sink in enumerate(sinks):  # round 0, one at a time: the Connect server's write path warm,
            sink.write(flush(i, 0))       # so the concurrent rounds' jobs overlap from the first
        threads = [threading.Thread(target=append, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert not any(t.is_alive() for t in threads), "appends still running after 10 min"
        rows = sinks[0].catalog.read().select("topic", "offset").collect()
        return failures, Counter((r[0], r[1]) for r in rows)
    finally:
        if started:
            started[0].catalog.spark.sql(f"DROP DATABASE IF EXISTS {config.database} CASCADE")
        for sink in sinks:
            sink.stop()


@pytest.mark.slow
def test_concurrent_appends_of_two_brokers_through_the_table_lock_land_once(connect_server, tmp_path):
    rounds = 12
    failures, rows = concurrent_appends(connect_server.url, tmp_path / "locked", shared_table=True, rounds=rounds)
    assert failures == []
    assert rows == Counter({(f"t{i}", o): 1 for i in range(2) for o in range((rounds + 1) * ROWS)})
    # No control without the lock: the same appends with shared_table=False failed (TASK_WRITE_FAILED)
    # in some runs and landed in others (2 x 12 concurrent appends, this 2-core machine under load),
    # too rarely for a test to assert, so this test does not reliably catch the lock's removal.
