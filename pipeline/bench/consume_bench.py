"""``pipeline bench --consume``: produce, then consume from the WAL and from the table, and tail (issue 10).

One run reports, beside each other, for the same records:

1. **produce**: one confluent-kafka (librdkafka) producer at default settings
   (``acks=all`` is librdkafka's default; keys spread the records over the
   partitions) writes ``records`` records of ``record_bytes`` value bytes
   (1 KiB by default) to a fresh topic, as fast as it is acknowledged, bounded
   by ``produce_timeout_s``. Records/s and MB/s of acknowledged records, from
   the first ``produce()`` to the last delivery report.
2. **consume from the WAL**: each client (confluent-kafka ``Consumer``,
   kafka-python ``KafkaConsumer``) ``assign``s every partition at offset 0 and
   reads everything just produced, while the server still holds it in its
   write-ahead log (``log.retention.ms`` is the default 1 h). Records/s and
   MB/s from ``assign`` to the last record.
3. **consume from the table**: the server is stopped (SIGTERM: everything is
   committed to the table) and started again on the same data directory with
   ``--log-retention-ms 0 --log-segment-bytes 1 MiB``; a trickle of records to
   a side topic makes the table commit that lets retention delete the old
   segments (the server logs ``log retention: N WAL segment(s) deleted``).
   The bench then scans the WAL directory (read-only) to count how many of
   the produced records are still in a segment: the rest can only come from
   the table. The same clients read everything again from offset 0. If the
   server serves no table reads (no table reader wired), the phase ends after
   ``stall_s`` without progress and says so.
4. **end-to-end latency**: on the first server, a confluent consumer thread
   tails a second topic while a producer in the same process writes ``rate``
   records/s for ``latency_duration_s`` s. Per record (the key is its
   sequence number) the bench keeps, on one clock (``time.perf_counter_ns``):
   the ``produce()`` call, the delivery report (acknowledgement) and the
   consumer's receipt. Reported: acknowledgement -> consumer delivery p50/p99
   (the issue's figure), and produce() -> delivery. A record can reach the
   consumer before the producer's delivery report is served (both follow the
   same WAL fsync); those count as 0 and are reported.

Every consume is verified by offset: per partition exactly the offsets
``0..n-1`` the producer was acknowledged, each once. Output in ``out``:
``results.json``, ``summary.md``, ``logs/`` (server logs); a rich table on
the terminal. Every loop is bounded in count and time, and the servers are
stopped (killed after 60 s) however the bench ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
import threading
import time
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message
    from hdrh.histogram import HdrHistogram
    from rich.console import Console

from pipeline.bench.processes import ManagedProcess, cpu_since, machine_and_kernel, server_cpu

TOPIC = "bench-consume"
LATENCY_TOPIC = "bench-consume-latency"
NUDGE_TOPIC = "bench-consume-nudge"
CLIENTS = ("confluent", "kafka-python")
RETENTION_LINE = re.compile(r"log retention: (\d+) WAL segment\(s\) deleted")
TABLE_SEGMENT_BYTES = 1 << 20
"""--log-segment-bytes of the table phase's server (bytes): small, so the retained tail is small."""


@dataclass(slots=True)
class ConsumeBenchOptions:
    """The plan of one ``--consume`` run. Sizes in bytes, times in seconds, rates in records/s.

    Attributes:
        out: output directory.
        records: records produced (and then consumed) in phases 1-3.
        record_bytes: value bytes per record.
        partitions: partitions of the auto-created topics (server ``--num-partitions``).
        clients: consumer clients, from ``CLIENTS``.
        rate: the latency phase's steady produce rate.
        latency_duration_s: the latency phase's length.
        produce_timeout_s: bound on the produce phase (the records not
            acknowledged by then are not produced, and the figures say so).
        consume_timeout_s: bound on each consume.
        stall_s: a consume ends after this long without a new record.
        table: run phase 3 (restart with short retention, read from the table).
        commit_interval_ms: server ``--table-commit-interval-ms``.
        server_args: extra ``pipeline serve`` arguments for every server.
    """

    out: Path = Path("bench-results/consume")
    records: int = 200_000
    record_bytes: int = 1024
    partitions: int = 4
    clients: list[str] = field(default_factory=lambda: list(CLIENTS))
    rate: float = 1000.0
    latency_duration_s: float = 20.0
    produce_timeout_s: float = 300.0
    consume_timeout_s: float = 300.0
    stall_s: float = 20.0
    table: bool = True
    commit_interval_ms: int = 1000
    server_args: list[str] = field(default_factory=list)


SMOKE: dict[str, Any] = dict(records=3000, rate=200.0, latency_duration_s=3.0, produce_timeout_s=60.0,
             consume_timeout_s=60.0, stall_s=30.0)
"""``--consume --smoke``: a few seconds of each phase (the CI size, tests/bench/test_consume_smoke.py).

``stall_s`` costs nothing when every record arrives (a consume ends at the last one); it is 30 s,
not less, because on a loaded 2-core CI machine the table phase's first record (the server's first
Spark read of the table) was seen to take more than 10 s, which ended the consume as "stalled"."""


def resolve_consume(args: Any) -> ConsumeBenchOptions:
    """The ``--consume`` plan from ``pipeline bench`` arguments (``--smoke`` shrinks every phase).

    Raises:
        ValueError: an option out of range (the message names it).
    """
    base = ConsumeBenchOptions(**(SMOKE if args.preset == "smoke" else {}))
    out = args.out if args.out != Path("bench-results") else Path("bench-results") / "consume"
    clients = [c.strip() for c in (args.consumers or ",".join(CLIENTS)).split(",") if c.strip()]
    opts = ConsumeBenchOptions(
        out=out, records=base.records if args.consume_records is None else args.consume_records,
        record_bytes=base.record_bytes if args.record_bytes is None else args.record_bytes,
        partitions=args.partitions or base.partitions, clients=clients,
        rate=args.rate or base.rate, latency_duration_s=args.duration or base.latency_duration_s,
        produce_timeout_s=base.produce_timeout_s, consume_timeout_s=base.consume_timeout_s, stall_s=base.stall_s,
        table=args.table_phase,
        commit_interval_ms=base.commit_interval_ms if args.commit_interval_ms is None else args.commit_interval_ms,
        server_args=list(args.server_arg))
    if not clients or any(c not in CLIENTS for c in clients):
        raise ValueError(f"--consumers are {', '.join(CLIENTS)}; got {args.consumers!r}")
    if not 1 <= opts.records <= 10_000_000 or not 1 <= opts.record_bytes <= 1_000_000:
        raise ValueError("--consume-records must be 1..10,000,000 and --record-bytes 1..1,000,000")
    if not 1 <= opts.partitions <= 64 or not 1 <= opts.rate <= 100_000 or not 1 <= opts.latency_duration_s <= 600:
        raise ValueError("--consume needs --partitions 1..64, --rate 1..100,000 records/s, --duration 1..600 s")
    if opts.commit_interval_ms < 1:
        raise ValueError("--commit-interval-ms must be >= 1")
    return opts


# ----------------------------------------------------------------- verification


@dataclass(slots=True)
class OffsetCheck:
    """Consumed offsets against the acknowledged ones, per partition.

    Attributes:
        expected: records acknowledged (offsets 0..n-1 of each partition).
        consumed: records received, duplicates included.
        unique: distinct acknowledged offsets received.
        missing: acknowledged offsets never received.
        duplicates: receipts of an offset already received.
        unexpected: receipts of offsets never acknowledged (past n, or another partition).
    """

    expected: int
    consumed: int
    unique: int
    missing: int
    duplicates: int
    unexpected: int

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicates == 0 and self.unexpected == 0


def check_offsets(acked: dict[int, int], received: dict[int, array]) -> OffsetCheck:
    """Compare ``received`` (partition -> offsets in arrival order) with ``acked`` (partition -> n:
    offsets 0..n-1 were acknowledged). Pure; O(records)."""
    expected = sum(acked.values())
    consumed = unique = duplicates = unexpected = 0
    for partition, offsets in received.items():
        n = acked.get(partition, 0)
        seen = bytearray(n)
        consumed += len(offsets)
        for o in offsets:
            if not 0 <= o < n:
                unexpected += 1
            elif seen[o]:
                duplicates += 1
            else:
                seen[o] = 1
                unique += 1
    return OffsetCheck(expected, consumed, unique, expected - unique, duplicates, unexpected)


# ------------------------------------------------------------------- producing


def produce(bootstrap: str, topic: str, records: int, record_bytes: int, timeout_s: float) -> dict:
    """Produce ``records`` values of ``record_bytes`` bytes with one librdkafka producer (acks=all),
    as fast as acknowledged: ``pipeline.bench.security_bench.produce``'s figures, ``acked``
    (partition -> n: offsets 0..n-1 acknowledged) among them."""
    from pipeline.bench.security_bench import produce as produce_records

    return produce_records({"bootstrap.servers": bootstrap, "acks": "all"}, topic, records, record_bytes, timeout_s)


# ------------------------------------------------------------------- consuming


def _confluent_consumer(bootstrap: str, topic: str, partitions: list[int]) -> tuple[Callable, Callable]:
    """(poll() -> [(partition, offset, value bytes, key)], close) of a confluent consumer assigned at offset 0."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pipeline-bench-consume",
                         "enable.auto.commit": False, "enable.partition.eof": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])

    def poll(timeout_s: float = 0.5, most: int = 10_000) -> list[tuple[int, int, int, bytes | None]]:
        # consume() returns when it has ``most`` messages or at the timeout, so ask for no more than are due.
        out: list[tuple[int, int, int, bytes | None]] = []
        for m in consumer.consume(num_messages=max(1, min(10_000, most)), timeout=timeout_s):
            partition, offset = m.partition(), m.offset()
            if m.error() is not None or partition is None or offset is None:
                raise RuntimeError(f"consumer error: {m.error() or 'a message without partition or offset'}")
            value = m.value()
            out.append((partition, offset, len(value) if value else 0, m.key()))
        return out

    return poll, consumer.close


def _kafka_python_consumer(bootstrap: str, topic: str, partitions: list[int]) -> tuple[Callable, Callable]:
    """The same with kafka-python's KafkaConsumer (no group: manual assignment, seek to 0)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             request_timeout_ms=40_000)
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)

    def poll(timeout_s: float = 0.5, most: int = 10_000) -> list[tuple[int, int, int, bytes | None]]:
        out: list[tuple[int, int, int, bytes | None]] = []
        for tp, messages in consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max(1, min(10_000, most))).items():
            out.extend((tp.partition, m.offset, len(m.value) if m.value else 0, m.key) for m in messages)
        return out

    return poll, consumer.close


CONSUMERS = {"confluent": _confluent_consumer, "kafka-python": _kafka_python_consumer}


def consume_all(client: str, bootstrap: str, topic: str, acked: dict[int, int], record_bytes: int,
                timeout_s: float, stall_s: float) -> dict:
    """Read every partition of ``topic`` from offset 0 until each has the ``acked`` records, ``timeout_s``
    passes, or ``stall_s`` passes without a new record.

    Returns figures: ``records`` (received, duplicates included), ``bytes``
    (value bytes), ``seconds`` (assign to the last record), ``records_per_s``,
    ``mb_per_s`` (10^6 bytes), ``first_record_s`` (assign to the first
    record), ``streaming_records_per_s`` (first to last record: without the
    client's start-up and the server's first read), ``ended`` ("complete", "timeout" or "stalled"), ``check``
    (``OffsetCheck`` as a dict), ``client_cpu_s`` (this process).
    """
    import psutil

    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])
    received: dict[int, array] = {p: array("q") for p in acked}
    next_needed = {p: 0 for p in acked}
    pending = {p for p, n in acked.items() if n > 0}
    total = sum(acked.values())
    started = time.perf_counter()
    poll, close = CONSUMERS[client](bootstrap, topic, sorted(acked))
    n = nbytes = 0
    first = last = None
    ended = "complete"
    try:
        while pending:
            now = time.perf_counter()
            if now - started > timeout_s:
                ended = "timeout"
                break
            if now - (last or started) > stall_s:
                ended = "stalled"
                break
            batch = poll(0.5, total - n)
            if not batch:
                continue
            last = time.perf_counter()
            first = first or last
            for partition, offset, size, _key in batch:
                received.setdefault(partition, array("q")).append(offset)
                nbytes += size
                if partition in pending and offset >= next_needed[partition]:
                    next_needed[partition] = offset + 1
                    if offset + 1 >= acked[partition]:
                        pending.discard(partition)
            n += len(batch)
    finally:
        close()
    seconds = max(1e-9, (last or time.perf_counter()) - started)
    streaming = (last - first) if first and last and last > first else None
    check = check_offsets(acked, received)
    return {"client": client, "records": n, "bytes": nbytes, "seconds": seconds,
            "records_per_s": n / seconds, "mb_per_s": nbytes / seconds / 1e6,
            "streaming_records_per_s": n / streaming if streaming else None,
            "first_record_s": (first - started) if first else None, "ended": ended,
            "check": asdict(check), "ok": check.ok, "client_cpu_s": sum(me.cpu_times()[:2]) - cpu0}


# ---------------------------------------------------------------------- latency


def latency(bootstrap: str, topic: str, partitions: int, rate: float, duration_s: float,
            record_bytes: int, consumer_config: dict | None = None) -> dict:
    """A consumer thread tails ``topic`` while this thread produces ``rate`` records/s for ``duration_s``.

    Times on one clock (``perf_counter_ns``) per record: produce() call,
    delivery report, consumer receipt. Returns figures in ms:
    ``ack_to_consume`` and ``produce_to_consume`` (p50/p90/p99/p99.9/max),
    ``produce_to_ack`` likewise, ``consumed_before_ack`` (records the consumer
    had before their delivery report was served; counted as 0 ms),
    ``records``, ``acked``, ``consumed``, ``missing``, ``rate_achieved``.
    """
    from confluent_kafka import Consumer, Producer, TopicPartition
    from hdrh.histogram import HdrHistogram

    total = max(1, int(rate * duration_s))
    sent_ns = array("q", [0]) * total
    ack_ns = array("q", [0]) * total
    got_ns = array("q", [0]) * total
    stop = threading.Event()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pipeline-bench-latency",
                         "enable.auto.commit": False, **(consumer_config or {})})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    consumed = [0]
    errors: list[str] = []

    def tail() -> None:
        # poll(), one message at a time: consume(num_messages=N) would hold records until it has N or
        # its timeout passes, which is latency the server did not add.
        try:
            while not stop.is_set() and consumed[0] < total:
                m = consumer.poll(0.1)
                now = time.perf_counter_ns()
                if m is None:
                    continue
                key = m.key()
                if m.error() is not None or key is None:
                    errors.append(str(m.error() or "a record without a key"))
                    continue
                i = int(key)
                if 0 <= i < total and not got_ns[i]:
                    got_ns[i] = now
                    consumed[0] += 1
        except Exception as exc:  # reported, not raised in a thread
            errors.append(repr(exc))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        key = msg.key()
        if err is None and key is not None:  # every record has its number as key
            ack_ns[int(key)] = time.perf_counter_ns()
        elif len(errors) < 20:
            errors.append(str(err))

    # The topic exists before the clock starts (auto-created by the first metadata request), and
    # the consumer has its assignment: the first records do not pay for either.
    producer.produce(topic, key=b"-1", value=b"warm-up", partition=0)
    producer.flush(30)
    thread = threading.Thread(target=tail, name="bench-latency-consumer", daemon=True)
    thread.start()
    value = os.urandom(record_bytes)
    began = time.perf_counter()
    try:
        for i in range(total):
            due = began + i / rate
            while (wait := due - time.perf_counter()) > 0:
                producer.poll(wait)  # serve delivery reports while waiting: ack times stay exact
            sent_ns[i] = time.perf_counter_ns()
            producer.produce(topic, key=b"%d" % i, value=value, on_delivery=on_delivery)
            producer.poll(0)
        producer.flush(30)
        elapsed = time.perf_counter() - began
        deadline = time.perf_counter() + 30
        while consumed[0] < total and time.perf_counter() < deadline and thread.is_alive():
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(10)
        consumer.close()

    def hist() -> Any:
        return HdrHistogram(1, 600_000_000, 3)  # microseconds, 1 us .. 10 min

    ack_to_got, sent_to_got, sent_to_ack = hist(), hist(), hist()
    early = acked = got = 0
    for i in range(total):
        if ack_ns[i]:
            acked += 1
            sent_to_ack.record_value(max(1, (ack_ns[i] - sent_ns[i]) // 1000))
        if got_ns[i]:
            got += 1
            sent_to_got.record_value(max(1, (got_ns[i] - sent_ns[i]) // 1000))
        if ack_ns[i] and got_ns[i]:
            delta = got_ns[i] - ack_ns[i]
            early += delta < 0
            ack_to_got.record_value(max(1, delta // 1000))

    def figures(h: HdrHistogram) -> dict:
        if h.get_total_count() == 0:
            return {}
        return {"p50": h.get_value_at_percentile(50) / 1000, "p90": h.get_value_at_percentile(90) / 1000,
                "p99": h.get_value_at_percentile(99) / 1000, "p99.9": h.get_value_at_percentile(99.9) / 1000,
                "max": h.get_max_value() / 1000}

    return {"records": total, "acked": acked, "consumed": got, "missing": total - got,
            "rate": rate, "rate_achieved": total / elapsed, "seconds": elapsed,
            "ack_to_consume_ms": figures(ack_to_got), "produce_to_consume_ms": figures(sent_to_got),
            "produce_to_ack_ms": figures(sent_to_ack), "consumed_before_ack": early, "errors": errors[:20]}


# ------------------------------------------------------------- WAL inspection


_ENTRY = struct.Struct(">II")  # payload length, CRC32C (pipeline.log.wal)


def records_in_wal(wal_dir: Path, topic: str) -> dict[int, int]:
    """partition -> the lowest offset of ``topic`` still in a WAL segment file (read-only scan).

    Offsets from there on can be served from the WAL; the ones below only
    from the table. A segment deleted during the scan is skipped; a torn or
    unreadable tail ends that segment's scan.
    """
    from pipeline.log.wal import decode_appends

    lowest: dict[int, int] = {}
    for path in sorted(wal_dir.glob("*.wal")):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        pos = 0
        while pos + _ENTRY.size <= len(data):
            length, _crc = _ENTRY.unpack_from(data, pos)
            end = pos + _ENTRY.size + length
            if length == 0 or end > len(data):
                break
            try:
                appends = decode_appends(memoryview(data)[pos + _ENTRY.size:end])
            except ValueError:
                break
            for a in appends:
                if a.topic == topic:
                    lowest[a.partition] = min(lowest.get(a.partition, a.base_offset), a.base_offset)
            pos = end
    return lowest


# ---------------------------------------------------------------------- servers


def _server_command(data_dir: Path, opts: ConsumeBenchOptions, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
            "--metrics-port", "0", "--spark-connect-port", "0", "--ack-on", "wal",
            "--num-partitions", str(opts.partitions), "--table-commit-interval-ms", str(opts.commit_interval_ms),
            *extra, *opts.server_args]


def _fetch_requests(server: ManagedProcess) -> float | None:
    """Fetch requests the server has handled (its request metrics), or None if /metrics is unreachable."""
    from pipeline.bench.processes import counter, scrape_metrics

    if server.metrics_port is None:
        return None
    try:
        return counter(scrape_metrics(server.metrics_port), "kafka_network_requestmetrics_requests_total",
                       request="Fetch") or 0.0  # no sample before the first fetch
    except OSError:
        return None


def _timed_consume(server: ManagedProcess, client: str, topic: str, acked: dict[int, int], opts: ConsumeBenchOptions) -> dict:
    fetches0, cpu0 = _fetch_requests(server), server_cpu(server)
    figures = consume_all(client, f"127.0.0.1:{server.port}", topic, acked, opts.record_bytes,
                          opts.consume_timeout_s, opts.stall_s)
    fetches1 = _fetch_requests(server)
    figures["server_cpu_s"] = cpu_since(cpu0, server_cpu(server))
    figures["fetch_requests"] = (fetches1 - fetches0) if fetches0 is not None and fetches1 is not None else None
    return figures


def _wait_for_retention(server: ManagedProcess, log_path: Path, wal_dir: Path, acked: dict[int, int],
                        timeout_s: float, console: Console) -> dict:
    """Trickle records to a side topic (each table commit lets retention run) until no segment holds
    ``TOPIC`` and the server has logged the deletion, or ``timeout_s`` passes. Returns what was deleted
    and what is left.

    Both are awaited: the server deletes the segment files (in a worker thread) before it logs
    ``log retention: N WAL segment(s) deleted`` (``LogManager.wal_truncated``), so files already gone
    do not mean the line is written yet.
    """
    from confluent_kafka import Producer

    def deleted() -> int:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        return sum(int(m.group(1)) for m in RETENTION_LINE.finditer(text))

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{server.port}"})
    deadline = time.monotonic() + timeout_s
    left = records_in_wal(wal_dir, TOPIC)
    # Retention may have run before the first look (at the start's first commit): the line is counted then.
    deleted_segments = deleted()
    try:
        while (left or not deleted_segments) and time.monotonic() < deadline:
            producer.produce(NUDGE_TOPIC, value=b"x" * 1024)
            producer.flush(10)
            time.sleep(0.5)
            left = records_in_wal(wal_dir, TOPIC)
            deleted_segments = deleted()
    finally:
        producer.flush(10)
    in_wal = sum(max(0, acked.get(p, 0) - low) for p, low in left.items())
    total = sum(acked.values())
    console.print(f"log retention deleted {deleted_segments} WAL segment(s); {in_wal} of {total} records "
                  f"are still in the WAL")
    return {"segments_deleted": deleted_segments, "records_in_wal": in_wal,
            "records_only_in_table": total - in_wal,
            "fraction_from_table": (total - in_wal) / total if total else None,
            "lowest_wal_offsets": {str(p): o for p, o in left.items()}}


# ------------------------------------------------------------------------ report


def _rows(result: dict) -> list[tuple[str, ...]]:
    """(phase, client, records, MB, seconds, records/s, MB/s, first record s, streaming records/s, check)
    rows of the throughput table."""
    rows: list[tuple[str, ...]] = []
    p = result["produce"]
    rows.append(("produce (acks=all)", "confluent", f"{p['records']:,}", f"{p['bytes'] / 1e6:.1f}",
                 f"{p['seconds']:.2f}", f"{p['records_per_s']:,.0f}", f"{p['mb_per_s']:.2f}", "", "",
                 "OK" if not p["errors"] and not p["timed_out"] else "INCOMPLETE"))
    for phase, name in (("wal", "consume from the WAL"), ("table", "consume from the table")):
        for c in result.get(phase, {}).get("consumers", []):
            check = c["check"]
            status = "OK" if c["ok"] else (f"{c['ended']}: {check['missing']:,} missing, "
                                           f"{check['duplicates']:,} dup, {check['unexpected']:,} unexpected")
            rows.append((name, c["client"], f"{c['records']:,}", f"{c['bytes'] / 1e6:.1f}", f"{c['seconds']:.2f}",
                         f"{c['records_per_s']:,.0f}", f"{c['mb_per_s']:.2f}",
                         f"{c['first_record_s']:.2f}" if c["first_record_s"] is not None else "-",
                         f"{c['streaming_records_per_s']:,.0f}" if c.get("streaming_records_per_s") else "-", status))
    return rows


def _summary(result: dict) -> str:
    m = result["machine"]
    lines = ["# pipeline bench --consume", "",
             f"`{result['command']}`", "",
             f"{result['started_utc']}, {m['cpus']} CPUs, {m['memory_gb']} GB, Python {m['python']}, "
             f"Linux {m['kernel']}, load average {m['load_average'][0]:.1f} at start; "
             f"{result['options']['records']:,} records of {result['options']['record_bytes']} B over "
             f"{result['options']['partitions']} partitions.", "",
             "| phase | client | records | MB | s | records/s | MB/s | first record s | streaming records/s | check |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(result)]
    table = result.get("table")
    if table:
        r = table.get("retention", {})
        lines += ["", f"Table phase: {r.get('segments_deleted', 0)} WAL segment(s) deleted by retention; "
                      f"{r.get('records_only_in_table', 0):,} of the records could only come from the table, "
                      f"{r.get('records_in_wal', 0):,} were still in the WAL. {table.get('note', '')}"]
    lat = result.get("latency")
    if lat:
        a, s = lat["ack_to_consume_ms"], lat["produce_to_consume_ms"]
        lines += ["", f"End-to-end latency at {lat['rate']:g} records/s for {lat['seconds']:.0f} s "
                      f"({lat['consumed']:,} of {lat['records']:,} records consumed):", "",
                  "| from | to | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |", "|---|---|---|---|---|---|---|"]
        for name, h in (("acknowledgement", a), ("produce()", s)):
            if h:
                lines.append(f"| {name} | consumer delivery | {h['p50']:.2f} | {h['p90']:.2f} | {h['p99']:.2f} | "
                             f"{h['p99.9']:.2f} | {h['max']:.2f} |")
        lines.append(f"\n{lat['consumed_before_ack']:,} records reached the consumer before their delivery "
                     "report was served (counted as 0 ms).")
    for t in result["targets"]:
        lines.append(f"\n- **{'met' if t['met'] else 'not met'}**: {t['target']} ({t['detail']})")
    return "\n".join(lines) + "\n"


def _targets(result: dict) -> list[dict]:
    produce_rps = result["produce"]["records_per_s"]
    out = []
    for c in result.get("wal", {}).get("consumers", []):
        out.append({"target": f"consuming from the WAL at least as fast as producing ({c['client']})",
                    "met": bool(c["ok"] and c["records_per_s"] >= produce_rps),
                    "detail": f"{c['records_per_s']:,.0f} vs {produce_rps:,.0f} records/s, "
                              f"{c['records_per_s'] / produce_rps:.2f}x" if produce_rps else "nothing produced"})
    return out


# -------------------------------------------------------------------------- main


def main(opts: ConsumeBenchOptions, argv: list[str] | None = None) -> int:
    """Run the four phases; exit code 1 if a consume missed or duplicated a record, or a phase failed."""
    from rich.console import Console
    from rich.table import Table



    import logging

    logging.getLogger("kafka").setLevel(logging.ERROR)  # kafka-python: connection chatter, slow-decode warnings
    console = Console(width=None if Console().is_terminal else 160)
    out = opts.out
    data_dir = out / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    command = "pipeline bench " + " ".join(argv or ["--consume"])
    result: dict[str, Any] = {"command": command, "started_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "machine": machine_and_kernel(),
                              "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()}}
    failed = False
    servers: list[ManagedProcess] = []

    def start(name: str, extra: list[str]) -> ManagedProcess:
        log_path = out / "logs" / f"{name}.log"
        log_path.unlink(missing_ok=True)
        server = ManagedProcess(name, _server_command(data_dir, opts, extra), log_path)
        servers.append(server)
        console.print(f"starting `{' '.join(server.cmd[2:])}`")
        server.start()
        result.setdefault("servers", {})[name] = {"command": " ".join(["pipeline", *server.cmd[3:]]),
                                                  "startup_s": round(server.startup_s, 1),
                                                  "listening_s": round(server.listening_s or 0.0, 1)}
        return server

    try:
        server = start("wal", [])
        bootstrap = f"127.0.0.1:{server.port}"
        console.print(f"producing {opts.records:,} records of {opts.record_bytes} B")
        cpu0 = server_cpu(server)
        produced = produce(bootstrap, TOPIC, opts.records, opts.record_bytes, opts.produce_timeout_s)
        produced["server_cpu_s"] = cpu_since(cpu0, server_cpu(server))
        acked = produced.pop("acked")
        produced["acked_per_partition"] = {str(p): n for p, n in sorted(acked.items())}
        result["produce"] = produced
        failed |= bool(produced["errors"]) or produced["timed_out"]

        result["wal"] = {"consumers": []}
        for client in opts.clients:
            console.print(f"consuming from the WAL with {client}")
            figures = _timed_consume(server, client, TOPIC, acked, opts)
            result["wal"]["consumers"].append(figures)
            failed |= not figures["ok"]
        left = records_in_wal(data_dir / "_pipeline" / "wal", TOPIC)
        result["wal"]["records_in_wal"] = sum(max(0, acked.get(p, 0) - low) for p, low in left.items())

        console.print(f"latency: {opts.rate:g} records/s for {opts.latency_duration_s:g} s, a consumer tailing")
        result["latency"] = latency(bootstrap, LATENCY_TOPIC, opts.partitions, opts.rate, opts.latency_duration_s,
                                    opts.record_bytes)
        failed |= result["latency"]["missing"] > 0
        code = server.stop()
        result["servers"]["wal"]["exit_code"] = code
        failed |= code != 0

        if opts.table:
            name = "table"
            server = start(name, ["--log-retention-ms", "0", "--log-segment-bytes", str(TABLE_SEGMENT_BYTES)])
            retention = _wait_for_retention(server, out / "logs" / f"{name}.log", data_dir / "_pipeline" / "wal",
                                            acked, 120.0, console)
            result["table"] = {"retention": retention, "consumers": []}
            for client in opts.clients:
                console.print(f"consuming from the table with {client}")
                figures = _timed_consume(server, client, TOPIC, acked, opts)
                result["table"]["consumers"].append(figures)
            if not any(c["records"] for c in result["table"]["consumers"]):
                result["table"]["note"] = ("The server served none of the records the WAL no longer holds: "
                                           "no table reader is wired into its LogManager yet.")
            else:
                failed |= not all(c["ok"] for c in result["table"]["consumers"])
            code = server.stop()
            result["servers"][name]["exit_code"] = code
            failed |= code != 0
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        console.print(f"[red]consume bench failed: {result['error']}[/red]")
        failed = True
    finally:
        for s in servers:
            if s.proc is not None and s.proc.poll() is None:
                s.stop()
    if "produce" not in result:
        (out / "results.json").write_text(json.dumps(result, indent=1))
        return 1
    result["targets"] = _targets(result)
    result["failed"] = failed
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "summary.md").write_text(_summary(result))

    table = Table(title=f"{command}  ({opts.records:,} x {opts.record_bytes} B, {opts.partitions} partitions)")
    columns = ("phase", "client", "records", "MB", "s", "records/s", "MB/s", "first record s", "streaming records/s",
               "check")
    for column in columns:
        table.add_column(column, justify="left" if column in ("phase", "client", "check") else "right")
    for row in _rows(result):
        table.add_row(*row)
    console.print(table)
    if result.get("table", {}).get("note"):
        console.print(f"[yellow]{result['table']['note']}[/yellow]")
    lat = result.get("latency")
    if lat and lat["ack_to_consume_ms"]:
        a, s = lat["ack_to_consume_ms"], lat["produce_to_consume_ms"]
        console.print(f"latency at {lat['rate']:g} records/s ({lat['consumed']:,}/{lat['records']:,} consumed): "
                      f"ack -> consumer p50 {a['p50']:.2f} ms, p99 {a['p99']:.2f} ms; "
                      f"produce() -> consumer p50 {s['p50']:.2f} ms, p99 {s['p99']:.2f} ms "
                      f"({lat['consumed_before_ack']:,} consumed before their ack was served)")
    for t in result["targets"]:
        console.print(f"{'met' if t['met'] else 'not met'}: {t['target']} ({t['detail']})")
    console.print(f"results: {out / 'results.json'}, {out / 'summary.md'}")
    return 1 if failed else 0
