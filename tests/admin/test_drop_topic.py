"""DeleteTopics' table side: ``TableCatalog.drop_topic`` against a real Spark session and Hive metastore."""

from __future__ import annotations

import os
from datetime import timedelta

import pyarrow as pa
import pytest

from pipeline.table.catalog import TableCatalog
from pipeline.table.table_config import TableConfig, TopicTableConfig
from pipeline.table.typed import split_typed
from tests.conftest import unique_database
from tests.table.test_catalog import DAY0, rows

pytestmark = pytest.mark.slow


def test_drop_topic_removes_its_rows_files_typed_table_and_dead_letters_only(spark, tmp_path):
    database = unique_database()
    config = TableConfig(database=database, file_delete_delay_ms=60_000, topics={
        "pay": TopicTableConfig(value_format="json", value_schema="id BIGINT")})
    catalog = TableCatalog(spark, tmp_path / "data", config)
    catalog.ensure()
    formats = catalog.value_formats()
    pay = rows("pay", 3, DAY0, timedelta(hours=1))
    pay = pay.set_column(pay.column_names.index("value"), "value",
                         pa.array([b'{"id": 1}', b"{oops", b'{"id": 3}'], pa.binary()))
    catalog.write_flush(split_typed(pay, formats))
    catalog.write(rows("orders", 4, DAY0, timedelta(hours=1)))
    catalog.write(rows("keep", 2, DAY0, timedelta(hours=1)))
    records_dir = catalog.data_dir / "tables" / "records"
    assert (records_dir / "topic=orders").is_dir()

    assert catalog.drop_topic("orders") == 4
    assert catalog.drop_topic("pay") == 2 + 1  # the typed table's 2 hours + 1 dead-letter partition
    counts = dict(spark.sql(f"SELECT topic, count(*) FROM {database}.records GROUP BY topic").collect())
    assert counts == {"keep": 2}
    assert not spark.catalog.tableExists(f"{database}.pay")
    assert spark.table(f"{database}.dead_letters").count() == 0
    # the files are gone at once (a re-created topic must not find them), not after file.delete.delay.ms
    assert not (records_dir / "topic=orders").exists()
    assert not os.path.exists(catalog.typed_tables["pay"].directory)
    assert catalog.pending_deletions() == []
    assert catalog.drop_topic("orders") == 0  # idempotent

    # a re-created topic's rows land and are the only ones
    catalog.write(rows("orders", 1, DAY0, timedelta(hours=1)))
    assert [tuple(r) for r in spark.sql(
        f"SELECT offset FROM {database}.records WHERE topic = 'orders'").collect()] == [(0,)]
    with pytest.raises(ValueError):
        catalog.drop_topic("x' OR '1'='1")
