"""The schema of the records table: the one Spark's own Kafka source produces.

Using Spark's Kafka source schema (with ``includeHeaders``) means a query written
against ``spark.readStream.format("kafka")`` runs unchanged on our Parquet table.
Source: Spark ``KafkaRecordToRowConverter.kafkaSchema(includeHeaders=true)``;
every field is nullable there (the StructField default), and headers is null,
not an empty array, for a record without headers.

``ARROW_SCHEMA`` is the Arrow form of ``SPARK_SCHEMA`` exactly as pyspark's
``to_arrow_schema(SPARK_SCHEMA, timezone="UTC")`` spells it, which is what
``SparkSession.createDataFrame(pa.Table)`` casts its input to: TimestampType is
``timestamp[us, tz=UTC]`` (Spark keeps microseconds since the epoch; a tz-aware
Arrow timestamp is an instant, so no session-time-zone shift is applied), and the
list element is named ``element``.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

COLUMNS: tuple[str, ...] = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
)

HEADERS_SPARK_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)

SPARK_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", HEADERS_SPARK_TYPE),
    ]
)

HEADER_ARROW_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_ARROW_TYPE = pa.list_(pa.field("element", HEADER_ARROW_TYPE))
TIMESTAMP_ARROW_TYPE = pa.timestamp("us", tz="UTC")

ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_ARROW_TYPE),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", HEADERS_ARROW_TYPE),
    ]
)
