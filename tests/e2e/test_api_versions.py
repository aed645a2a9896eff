"""Honest ApiVersions, end to end: every api and version the server advertises is served.

The shared ``pipeline serve`` (tests/e2e/conftest.py) is asked ApiVersions; then, for every advertised
(api key, version), a representative request (``sample_request``: the same
ones the protocol tests decode) is sent on a fresh connection. Each must get
a response with its correlation id that kio decodes completely as that api's
response at that version, and the connection must stay open. An api that was
advertised but not served would close the connection instead (issue 10).
"""

from __future__ import annotations

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from tests.e2e import raw_client as rc
from tests.e2e.shared_server import LogCursor
from tests.protocol.protocol_helpers import read_response, sample_request

pytestmark = pytest.mark.slow


def test_every_advertised_api_and_version_is_served(multiqueue_server):
    # (the sample requests name topics "events", "audit", "manual" and group "orders": no other
    # test on the shared server uses those names)
    server = multiqueue_server
    log = LogCursor(server)
    raw = rc.RawClient(server.host, server.port, timeout_s=30)
    raw.send(rc.frame(ApiVersionsRequest(client_software_name="honesty", client_software_version="1"), 1))
    cid, rest = raw.read_response()
    _, body = read_response(18, 3, cid.to_bytes(4, "big") + rest)
    raw.close()
    advertised = {(int(k.api_key), v) for k in body.api_keys for v in range(k.min_version, k.max_version + 1)}
    assert len(advertised) > 100
    failures = []
    for number, (api_key, version) in enumerate(sorted(advertised), start=100):
        raw = rc.RawClient(server.host, server.port, timeout_s=30)
        try:
            raw.send(rc.frame(sample_request(api_key, version), number))
            cid, rest = raw.read_response()
            assert cid == number
            read_response(api_key, version, cid.to_bytes(4, "big") + rest)  # decodes, nothing left over
        except Exception as exc:  # collect every failure, not only the first
            failures.append((api_key, version, repr(exc)[:200]))
        finally:
            raw.close()
    assert failures == []
    assert "not served" not in log.text()
    assert server.running
