"""The benchmark's verification logic, fed hand-made sequences (pure, fast)."""

from __future__ import annotations

from pipeline.bench.verify import (
    ExpectedRequest,
    Response,
    RunVerification,
    check_table,
    expected_from_responses,
    offset_order,
    response_order,
)


def clean_responses(conns: int = 2, requests: int = 4, records: int = 3) -> list[Response]:
    """conn c writes partition c % 2; offsets handed out round-robin over connections."""
    out, next_offset = [], {0: 0, 1: 0}
    for req in range(requests):
        for conn in range(conns):
            p = conn % 2
            out.append(Response(conn, req, p, next_offset[p], records))
            next_offset[p] += records
    return out


def rows_for(responses: list[Response]) -> list[tuple[int, int, tuple[int, int, int]]]:
    return [(r.partition, r.base_offset + i, (r.conn, r.req, i)) for r in responses for i in range(r.records)]


def test_one_out_of_order_response_and_one_duplicated_offset_are_both_reported():
    # conn 0 sent requests 0..3; the response to 2 overtook the one to 1,
    # and request 3 was given request 2's offset (10) again.
    responses = [
        Response(0, 0, 0, 0, 5),
        Response(0, 2, 0, 10, 5),
        Response(0, 1, 0, 5, 5),
        Response(0, 3, 0, 10, 5),
    ]
    order = response_order({0: [r.req for r in responses]}, {0: 4})
    assert order.out_of_order.count == 1
    assert "request 1" in order.out_of_order.examples[0]
    assert order.duplicated.count == 0 and order.missing.count == 0

    offsets = offset_order(responses)
    assert offsets.duplicated.count == 1
    assert "offset 10" in offsets.duplicated.examples[0]
    # request 3 (sent after 2) did not get a higher base offset than 2
    assert offsets.not_increasing.count == 1
    assert "request 3" in offsets.not_increasing.examples[0]

    verification = RunVerification(order, offsets, check_table(expected_from_responses(responses), []))
    assert not verification.ok
    assert verification.ordering_violations >= 3


def test_clean_sequences_report_nothing():
    responses = clean_responses()
    arrivals = {c: [r.req for r in responses if r.conn == c] for c in (0, 1)}
    order = response_order(arrivals, {0: 4, 1: 4})
    offsets = offset_order(responses)
    table = check_table(expected_from_responses(responses), rows_for(responses))
    v = RunVerification(order, offsets, table)
    assert v.violations == 0 and v.ok
    assert table.rows == table.expected == 2 * 4 * 3


def test_missing_and_duplicated_responses():
    order = response_order({0: [0, 1, 1], 1: []}, {0: 3, 1: 2, 2: 1})
    assert order.duplicated.count == 1
    assert order.missing.count == 1 + 2 + 1  # conn 0 request 2, conn 1 both, conn 2 its one


def test_out_of_order_counts_each_late_response_once():
    order = response_order({0: [3, 0, 1, 2]})
    assert order.out_of_order.count == 3


def test_error_responses_are_not_offset_checked_but_counted():
    offsets = offset_order([Response(0, 0, 0, -1, 5, error_code=56), Response(0, 1, 0, 0, 5)])
    assert offsets.errors.count == 1 and offsets.violations == 0


def test_table_check_catches_missing_duplicate_and_reordered_rows():
    responses = clean_responses(conns=1, requests=3, records=2)  # offsets 0..5 on partition 0
    expected = expected_from_responses(responses)
    rows = rows_for(responses)

    missing = check_table(expected, rows[:-1])
    assert missing.missing.count == 1 and missing.violations == 1

    duplicated = check_table(expected, rows + [(0, 6, rows[0][2])])
    assert duplicated.duplicated.count == 1

    two_at_one_offset = check_table(expected, rows + [(0, 5, (0, 9, 0))])
    assert two_at_one_offset.duplicated.count == 1 and two_at_one_offset.unexpected.count == 1

    # request 0's and request 1's records swapped places in the partition
    swapped = [(p, o, name) for p, o, name in rows]
    swapped[0], swapped[2] = (0, 0, rows[2][2]), (0, 2, rows[0][2])
    swapped[1], swapped[3] = (0, 1, rows[3][2]), (0, 3, rows[1][2])
    report = check_table(expected, swapped)
    assert report.misplaced.count == 4
    assert report.out_of_order.count == 2
    assert report.missing.count == 0 and report.duplicated.count == 0

    gap = check_table(expected, [r for r in rows if r[1] != 2])
    assert gap.gaps.count == 1 and gap.missing.count == 1

    foreign = check_table(expected, rows + [(0, 6, None)])
    assert foreign.unexpected.count == 1


def test_table_check_without_offsets_checks_presence_and_send_order():
    # acks=0: no offsets were returned; conn 0 and conn 1 interleave on partition 0
    expected = [ExpectedRequest(c, r, 0, 2) for c in (0, 1) for r in range(2)]
    order = [(0, 0), (1, 0), (0, 1), (1, 1)]
    rows = [(0, 2 * n + i, (c, r, i)) for n, (c, r) in enumerate(order) for i in range(2)]
    assert check_table(expected, rows).violations == 0

    reordered = [(0, 2 * n + i, (c, r, i)) for n, (c, r) in enumerate([(0, 1), (1, 0), (0, 0), (1, 1)])
                 for i in range(2)]
    report = check_table(expected, reordered)
    assert report.out_of_order.count == 2 and report.misplaced.count == 0

    wrong_partition = rows[:-1] + [(1, 0, rows[-1][2])]
    assert check_table(expected, wrong_partition).misplaced.count == 1
