"""Structured logs (pipeline/observe/structured_logs.py): formats, request ids from the context, warnings, children's stderr."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time
import warnings

import pytest

from pipeline.observe.structured_logs import LogConfig, children_stderr_to_log, log_context, setup_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level, showwarning = root.handlers[:], root.level, warnings.showwarning
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    warnings.showwarning = showwarning
    logging.getLogger("py4j").setLevel(logging.NOTSET)


def test_json_lines_carry_ts_level_logger_message_ids_and_extra_fields(restore_logging):
    out = io.StringIO()
    setup_logging(LogConfig(format="json"), out)
    log = logging.getLogger("pipeline.requests.handler")
    token = log_context.set(("127.0.0.1:9092-127.0.0.1:50000-7", 42))
    try:
        log.warning("bad batch\nsecond line")
    finally:
        log_context.reset(token)
    log.info("Spark ready in %.1f s", 8.25, extra={"stage": "spark", "seconds": 8.25})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # a newline in a message and a traceback stay inside their line
    first, second, third = (json.loads(line) for line in lines)
    assert first["level"] == "WARNING" and first["logger"] == "pipeline.requests.handler"
    assert first["message"] == "bad batch\nsecond line"
    assert first["connection_id"] == "127.0.0.1:9092-127.0.0.1:50000-7" and first["correlation_id"] == 42
    assert first["ts"].endswith("Z") and time.strptime(first["ts"][:19], "%Y-%m-%dT%H:%M:%S")
    assert second["message"] == "Spark ready in 8.2 s" and second["stage"] == "spark" and second["seconds"] == 8.25
    assert "connection_id" not in second  # not about a request: no ids at all
    assert third["message"] == "failed" and "ValueError: boom" in third["exc"]


def test_plain_lines_name_the_ids_the_message_does_not(restore_logging):
    out = io.StringIO()
    setup_logging(LogConfig(format="plain"), out)
    log = logging.getLogger("pipeline.network.channel")
    token = log_context.set(("127.0.0.1:9092-127.0.0.1:50000-7", 3))
    try:
        log.info("client %s", "kafka-python")
        log.warning("closing connection %s: %s", "127.0.0.1:9092-127.0.0.1:50000-7", "idle")
    finally:
        log_context.reset(token)
    log.warning("closing connection %s: %s", "c-1", "idle", extra={"connection_id": "c-1"})
    first, second, third = out.getvalue().splitlines()
    assert first.endswith(" INFO pipeline.network.channel: client kafka-python "
                          "[connection_id=127.0.0.1:9092-127.0.0.1:50000-7 correlation_id=3]")
    assert second.endswith("closing connection 127.0.0.1:9092-127.0.0.1:50000-7: idle [correlation_id=3]")
    assert third.endswith("WARNING pipeline.network.channel: closing connection c-1: idle")


def test_context_ids_follow_trio_tasks():
    """A connection's task sets its id; the tasks it starts inherit it, other tasks do not see it."""
    import trio

    seen: dict[str, tuple] = {}

    async def connection() -> None:
        log_context.set(("conn-1", None))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)

    async def child() -> None:
        seen["child"] = log_context.get()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection)
        seen["parent"] = log_context.get()

    trio.run(main)
    assert seen == {"child": ("conn-1", None), "parent": (None, None)}


def test_third_party_warnings_go_to_debug_ours_to_warning(restore_logging):
    out = io.StringIO()
    setup_logging(LogConfig(level="INFO"), out)
    import pipeline.observe.structured_logs as logs_module

    with warnings.catch_warnings():  # keeps setup_logging's showwarning, restores the filters
        warnings.simplefilter("always")
        warnings.warn_explicit("dbName is deprecated", FutureWarning, "/venv/site-packages/pyspark/sql/catalog.py", 1)
        warnings.warn_explicit("our own", UserWarning, logs_module.__file__, 1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "WARNING py.warnings:" in lines[0] and "UserWarning: our own" in lines[0]
    out.truncate(0)
    out.seek(0)
    logging.getLogger().setLevel(logging.DEBUG)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn_explicit("dbName is deprecated", FutureWarning, "/venv/site-packages/pyspark/sql/catalog.py", 1)
    assert "DEBUG py.warnings: /venv/site-packages/pyspark/sql/catalog.py:1: FutureWarning: dbName" in out.getvalue()


def test_children_stderr_becomes_log_records(restore_logging):
    """A child started inside the block writes Spark-style log4j lines (one with a stack
    trace), the JVM's incubator warning and a stray line: each becomes one record."""
    out = io.StringIO()
    setup_logging(LogConfig(level="DEBUG", format="json"), out)
    child = (
        "import sys\n"
        "w = sys.stderr.write\n"
        "w('WARNING: Using incubator modules: jdk.incubator.vector\\n')\n"
        "w('2026-11-23 10:00:00,123 WARN spark SparkContext: something odd\\n')\n"
        "w('2026-11-23 10:00:00,124 ERROR spark Executor: task failed\\n')\n"
        "w('java.lang.IllegalStateException: bad\\n\\tat org.apache.spark.X.y(X.scala:1)\\n')\n"
        "w('Caused by: java.io.IOException: disk\\n\\t... 3 more\\n')\n"
        "w('Error: JAVA_HOME is not set\\n')\n"
        "w('Picked up JAVA_TOOL_OPTIONS: -XX:TieredStopAtLevel=1\\n')\n"
    )
    with children_stderr_to_log():
        subprocess.run([sys.executable, "-c", child], check=True)
        logging.getLogger("pipeline").info("our own line while the block runs")
    deadline = time.monotonic() + 10
    while out.getvalue().count("\n") < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    by_logger = {e["logger"]: e for e in events}
    assert by_logger["pipeline"]["message"] == "our own line while the block runs"
    assert by_logger["spark.SparkContext"]["level"] == "WARNING"
    assert by_logger["spark.SparkContext"]["message"] == "something odd"
    executor = by_logger["spark.Executor"]
    assert executor["level"] == "ERROR" and executor["message"].splitlines() == [
        "task failed", "java.lang.IllegalStateException: bad", "\tat org.apache.spark.X.y(X.scala:1)",
        "Caused by: java.io.IOException: disk", "\t... 3 more"]
    stray = [e for e in events if e["logger"] == "stderr"]
    assert [(e["level"], e["message"]) for e in stray] == [
        ("DEBUG", "WARNING: Using incubator modules: jdk.incubator.vector"),
        ("WARNING", "Error: JAVA_HOME is not set"),
        ("DEBUG", "Picked up JAVA_TOOL_OPTIONS: -XX:TieredStopAtLevel=1")]
    assert len(events) == 6


def test_the_incubator_line_is_not_shown_at_info(restore_logging):
    out = io.StringIO()
    setup_logging(LogConfig(level="INFO"), out)
    with children_stderr_to_log():
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write("
                        "'WARNING: Using incubator modules: jdk.incubator.vector\\nreal problem\\n')"], check=True)
    deadline = time.monotonic() + 10
    while "real problem" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith("WARNING stderr: real problem")


def test_py4j_lines_through_the_root_logger_are_held_to_py4js_level(restore_logging):
    """py4j logs "Exception while sending command." (a stack trace of the gateway closing while Spark
    stops) with ``logging.info``, so through the root logger: dropped as py4j's own INFO lines are,
    kept at DEBUG; another root INFO line and a py4j ERROR line pass."""
    import py4j.java_gateway

    def root_line(pathname: str, level: int, message: str) -> None:
        logging.root.handle(logging.root.makeRecord("root", level, pathname, 1056, message, (), None))

    out = io.StringIO()
    setup_logging(LogConfig(), out)
    root_line(py4j.java_gateway.__file__, logging.INFO, "Exception while sending command.")
    root_line(__file__, logging.INFO, "another root line")
    root_line(py4j.java_gateway.__file__, logging.ERROR, "py4j error")
    text = out.getvalue()
    assert "Exception while sending command." not in text
    assert "another root line" in text and "py4j error" in text
    debug = io.StringIO()
    setup_logging(LogConfig(level="DEBUG"), debug)
    root_line(py4j.java_gateway.__file__, logging.INFO, "Exception while sending command.")
    assert "Exception while sending command." in debug.getvalue()
