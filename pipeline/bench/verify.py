"""What a benchmark run must prove besides speed: ordering and exactly-once storage (sans-I/O).

Three checks, each a pure function of what the load generator saw and what the
table holds, so they are tested with hand-written sequences:

(a) ``response_order``: on each connection, responses arrive in the order the
    requests were sent (Kafka's per-connection promise, InFlightRequests).
(b) ``offset_order``: for each partition, the base offsets a connection is
    given grow strictly in the order it sent the requests; and no two
    requests anywhere are given overlapping offset ranges (a duplicated offset).
(c) ``check_table``: after the run the table holds exactly the acknowledged
    records, each once, at the offsets they were acknowledged with, gapless
    per partition, and each connection's records in its send order.

Requests are named ``(conn, req)``: connection number and request number on
that connection, which is also the order it was sent in. Records are named
``(conn, req, index)``; the benchmark writes that name into each record key
(``pipeline.bench.frames.record_key``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

MAX_EXAMPLES = 5
"""Examples of each kind of violation kept for the report (counts are always complete)."""


@dataclass(frozen=True, slots=True)
class Response:
    """One produce response as the client saw it.

    Attributes:
        conn: connection number.
        req: request number on that connection (send order; also its correlation id).
        partition: the partition the request wrote to.
        base_offset: offset given to its first record (-1 when error_code != 0).
        records: records the request carried.
        error_code: Kafka error code for the partition (0 = none).
    """

    conn: int
    req: int
    partition: int
    base_offset: int
    records: int
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class ExpectedRequest:
    """A request whose records the table must hold.

    ``base_offset`` is None when the client was not told one (acks=0): then the
    records must be present once each, in send order, but at any offsets.
    """

    conn: int
    req: int
    partition: int
    records: int
    base_offset: int | None = None


@dataclass(slots=True)
class Finding:
    """A count of one kind of violation plus a few examples (strings) for the report."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str, n: int = 1) -> None:
        """Count ``n`` violations described by ``example``."""
        self.count += n
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(example)

    def to_json(self) -> dict:
        return {"count": self.count, "examples": list(self.examples)}


@dataclass(slots=True)
class ResponseOrderReport:
    """(a) per-connection response order.

    ``out_of_order``: responses that arrived after the response to a request
    sent later on the same connection. ``duplicated``: a request answered twice.
    ``missing``: requests sent but never answered (only when ``sent`` is given).
    """

    out_of_order: Finding = field(default_factory=Finding)
    duplicated: Finding = field(default_factory=Finding)
    missing: Finding = field(default_factory=Finding)

    @property
    def violations(self) -> int:
        return self.out_of_order.count + self.duplicated.count + self.missing.count


def response_order(
    arrivals: Mapping[int, Sequence[int]], sent: Mapping[int, int] | None = None
) -> ResponseOrderReport:
    """Check (a).

    Args:
        arrivals: connection -> request numbers in the order their responses arrived.
        sent: connection -> number of requests sent (numbered 0..n-1); None skips
            the missing-response check.

    Returns:
        The report; a response is out of order if a later-sent request of its
        connection was answered before it (so one late response counts once,
        however many overtook it).
    """
    report = ResponseOrderReport()
    for conn, reqs in sorted(arrivals.items()):
        highest = -1
        seen: set[int] = set()
        for position, req in enumerate(reqs):
            if req in seen:
                report.duplicated.add(f"conn {conn}: request {req} answered twice")
                continue
            seen.add(req)
            if req < highest:
                report.out_of_order.add(
                    f"conn {conn}: response to request {req} arrived at position {position}, "
                    f"after the response to request {highest}"
                )
            highest = max(highest, req)
    if sent is not None:
        for conn, n in sorted(sent.items()):
            answered = {req for req in arrivals.get(conn, ()) if 0 <= req < n}
            if len(answered) < n:
                first = min(set(range(n)) - answered)
                report.missing.add(f"conn {conn}: {n - len(answered)} of {n} request(s) never answered, "
                                   f"first request {first}", n - len(answered))
    return report


@dataclass(slots=True)
class OffsetOrderReport:
    """(b) offsets handed out.

    ``not_increasing``: a request whose base offset is not above the one given
    to the previous request its connection sent to the same partition.
    ``duplicated``: a request whose offset range overlaps another request's.
    ``errors``: responses with a non-zero error code (no offsets to check).
    """

    not_increasing: Finding = field(default_factory=Finding)
    duplicated: Finding = field(default_factory=Finding)
    errors: Finding = field(default_factory=Finding)

    @property
    def violations(self) -> int:
        return self.not_increasing.count + self.duplicated.count


def offset_order(responses: Iterable[Response]) -> OffsetOrderReport:
    """Check (b) over every response of a run (all connections, one topic).

    Returns:
        The report. Error responses are counted in ``errors`` and skipped.
    """
    report = OffsetOrderReport()
    by_conn_partition: dict[tuple[int, int], list[Response]] = defaultdict(list)
    by_partition: dict[int, list[Response]] = defaultdict(list)
    for r in responses:
        if r.error_code:
            report.errors.add(f"conn {r.conn} request {r.req}: error code {r.error_code}")
            continue
        by_conn_partition[(r.conn, r.partition)].append(r)
        by_partition[r.partition].append(r)
    for (conn, partition), rs in sorted(by_conn_partition.items()):
        rs.sort(key=lambda r: r.req)
        for prev, cur in zip(rs, rs[1:]):
            if cur.base_offset <= prev.base_offset:
                report.not_increasing.add(
                    f"conn {conn} partition {partition}: request {cur.req} got base offset "
                    f"{cur.base_offset}, request {prev.req} (sent before it) got {prev.base_offset}"
                )
    for partition, rs in sorted(by_partition.items()):
        rs.sort(key=lambda r: (r.base_offset, r.conn, r.req))
        end, owner_conn, owner_req = -1, -1, -1  # the end offset so far, and who reached it
        for r in rs:
            if r.base_offset < end:
                report.duplicated.add(
                    f"partition {partition}: offset {r.base_offset} given to conn {r.conn} request "
                    f"{r.req} and to conn {owner_conn} request {owner_req}"
                )
            if r.base_offset + r.records > end:
                end, owner_conn, owner_req = r.base_offset + r.records, r.conn, r.req
    return report


@dataclass(slots=True)
class TableReport:
    """(c) what the table holds, against what was acknowledged (or sent, for acks=0).

    ``missing``: expected records not in the table. ``duplicated``: a record
    stored more than once, or two rows at one offset. ``unexpected``: rows
    nobody was told were stored (unknown key, other partition, not acked).
    ``misplaced``: a record at another offset than acknowledged. ``out_of_order``:
    within a partition, a connection's record stored before one it sent earlier.
    ``gaps``: holes in a partition's offsets 0..n-1.
    """

    rows: int = 0
    expected: int = 0
    missing: Finding = field(default_factory=Finding)
    duplicated: Finding = field(default_factory=Finding)
    unexpected: Finding = field(default_factory=Finding)
    misplaced: Finding = field(default_factory=Finding)
    out_of_order: Finding = field(default_factory=Finding)
    gaps: Finding = field(default_factory=Finding)

    @property
    def violations(self) -> int:
        return (self.missing.count + self.duplicated.count + self.unexpected.count
                + self.misplaced.count + self.out_of_order.count + self.gaps.count)


def check_table(
    expected: Iterable[ExpectedRequest],
    rows: Iterable[tuple[int, int, tuple[int, int, int] | None]],
) -> TableReport:
    """Check (c) for one topic.

    Args:
        expected: the requests whose records must be stored (acked ones for
            acks=1/-1 with their base offsets; every sent one for acks=0).
        rows: stored rows as ``(partition, offset, (conn, req, index))``; the
            record name is None when the key is not a benchmark key.

    Returns:
        The report. Memory is O(expected records + rows).
    """
    report = TableReport()
    want: dict[tuple[int, int, int], tuple[int, int | None]] = {}  # record -> (partition, offset)
    for e in expected:
        for i in range(e.records):
            want[(e.conn, e.req, i)] = (
                e.partition, None if e.base_offset is None else e.base_offset + i)
    report.expected = len(want)

    seen_records: set[tuple[int, int, int]] = set()
    seen_offsets: set[tuple[int, int]] = set()
    by_partition: dict[int, list[tuple[int, tuple[int, int, int]]]] = defaultdict(list)
    for partition, offset, name in rows:
        report.rows += 1
        if (partition, offset) in seen_offsets:
            report.duplicated.add(f"partition {partition} offset {offset} stored twice")
        seen_offsets.add((partition, offset))
        if name is None:
            report.unexpected.add(f"partition {partition} offset {offset}: not a benchmark key")
            continue
        if name in seen_records:
            report.duplicated.add(f"record {_name(name)} stored twice (again at {partition}/{offset})")
            continue
        seen_records.add(name)
        by_partition[partition].append((offset, name))
        place = want.get(name)
        if place is None:
            report.unexpected.add(f"record {_name(name)} at {partition}/{offset} was never acknowledged")
        elif place[0] != partition or (place[1] is not None and place[1] != offset):
            where = f"{place[0]}/{'?' if place[1] is None else place[1]}"
            report.misplaced.add(f"record {_name(name)} at {partition}/{offset}, acknowledged at {where}")
    for name in want.keys() - seen_records:
        report.missing.add(f"record {_name(name)} (acknowledged at "
                           f"{want[name][0]}/{'?' if want[name][1] is None else want[name][1]}) not stored")

    for partition, stored in sorted(by_partition.items()):
        stored.sort()
        expect_offset = 0
        last_of_conn: dict[int, tuple[int, int]] = {}
        for offset, (conn, req, index) in stored:
            if offset > expect_offset:
                report.gaps.add(f"partition {partition}: offsets {expect_offset}..{offset - 1} missing")
            expect_offset = max(expect_offset, offset + 1)
            prev = last_of_conn.get(conn)
            if prev is not None and (req, index) < prev:
                report.out_of_order.add(
                    f"partition {partition} offset {offset}: record {_name((conn, req, index))} stored "
                    f"after record {_name((conn, *prev))}")
            last_of_conn[conn] = max(prev, (req, index)) if prev is not None else (req, index)
    return report


def _name(record: tuple[int, int, int]) -> str:
    return f"c{record[0]}/r{record[1]}/i{record[2]}"


@dataclass(slots=True)
class RunVerification:
    """Everything checked for one run; ``ok`` when no check found a violation.

    ``table`` is None when the table was not read (e.g. the server failed).
    """

    response_order: ResponseOrderReport
    offset_order: OffsetOrderReport
    table: TableReport | None = None

    @property
    def ordering_violations(self) -> int:
        """What the ablation is expected to show: responses out of order (a),
        offsets not increasing or duplicated (b), records stored out of a
        connection's send order (c)."""
        return (self.response_order.out_of_order.count + self.offset_order.violations
                + (self.table.out_of_order.count if self.table is not None else 0))

    @property
    def violations(self) -> int:
        return (self.response_order.violations + self.offset_order.violations
                + (self.table.violations if self.table is not None else 0))

    @property
    def ok(self) -> bool:
        return self.violations == 0 and self.offset_order.errors.count == 0 and self.table is not None

    def to_json(self) -> dict:
        out = {
            "ok": self.ok,
            "violations": self.violations,
            "response_order": {
                "out_of_order": self.response_order.out_of_order.to_json(),
                "duplicated": self.response_order.duplicated.to_json(),
                "missing": self.response_order.missing.to_json(),
            },
            "offset_order": {
                "not_increasing": self.offset_order.not_increasing.to_json(),
                "duplicated": self.offset_order.duplicated.to_json(),
                "error_responses": self.offset_order.errors.to_json(),
            },
            "table": None,
        }
        if self.table is not None:
            t = self.table
            out["table"] = {
                "rows": t.rows, "expected": t.expected,
                **{k: getattr(t, k).to_json() for k in
                   ("missing", "duplicated", "unexpected", "misplaced", "out_of_order", "gaps")},
            }
        return out


def expected_from_responses(responses: Iterable[Response]) -> list[ExpectedRequest]:
    """The acknowledged requests (error code 0) as table expectations."""
    return [ExpectedRequest(r.conn, r.req, r.partition, r.records, r.base_offset)
            for r in responses if not r.error_code]
