"""A failing Spark write acknowledges nothing, and the server recovers when Spark does.

With ``--ack-on spark`` a produce is answered only after the Spark write that
holds its records commits. The table path is made unwritable by putting a
plain file where the table directory must be (root ignores permission bits,
so chmod would not do): every write fails. During that time no produce may be
answered with success; a produce whose timeout passes gets REQUEST_TIMED_OUT.
Once the table path is restored, the retried write lands every record, once.
"""

from __future__ import annotations

import os
import socket

import pytest

from tests.e2e.table_reader import read_table
from tests.e2e import raw_client as rc
from tests.e2e.server_process import ServerProcess

pytestmark = pytest.mark.slow

REQUEST_TIMED_OUT = 7


def partition_response(body: bytes):
    return rc.decode_produce_response(body).responses[0].partition_responses[0]


def test_no_success_ack_while_spark_fails_then_recovery(tmp_path):
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir, "--ack-on", "spark", "--linger-ms", "20").start()
    try:
        client = rc.RawClient(server.host, server.port, timeout_s=60)
        client.send(rc.frame(rc.metadata("fail"), 1))
        client.read_response()
        client.send(rc.frame(rc.produce("fail", [b"before"]), 2))
        cid, body = client.read_response()
        assert cid == 2 and partition_response(body).error_code == 0

        records = data_dir / "tables" / "records"
        moved = data_dir / "tables" / "records-away"
        os.rename(records, moved)
        records.write_bytes(b"not a directory")  # every Spark write now fails
        try:
            client.send(rc.frame(rc.produce("fail", [b"during-1", b"during-2"]), 3))
            client.send(rc.frame(rc.produce("fail", [b"during-3"], timeout_ms=2_000), 4))
            client.sock.settimeout(6)
            with pytest.raises(socket.timeout):
                client.read_response()  # nothing may be acknowledged while Spark fails
        finally:
            records.unlink()
            os.rename(moved, records)
        client.sock.settimeout(90)
        answers = dict(client.read_response() for _ in range(2))
        # responses keep request order: 3 (waited for the retry) comes before 4
        first = partition_response(answers[3])
        assert first.error_code == 0, "acknowledged after the retried write committed"
        # request 4 asked for a 2 s timeout: it was answered REQUEST_TIMED_OUT, never success
        assert partition_response(answers[4]).error_code == REQUEST_TIMED_OUT
        client.close()
    finally:
        code = server.stop() if server.running else None
    assert code == 0, server.log_text()
    assert "Spark flush of" in server.log_text()

    rows = read_table(data_dir, "SELECT value, offset FROM records")
    values = sorted(bytes(r["value"]) for r in rows)
    # the timed-out request's record is durable in the WAL and lands too (it was
    # never acknowledged, so a client retry could add it again; this one did not retry)
    assert values == [b"before", b"during-1", b"during-2", b"during-3"]
    offsets = sorted(r["offset"] for r in rows)
    assert offsets == [0, 1, 2, 3]
    assert first.base_offset == 1
