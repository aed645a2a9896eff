"""docs/table.md's "Avro types as columns" and "Protobuf types as columns" tables are what the typed tables
do: each row's type, as a record's (a message's) one field, becomes the Spark column type the row names
(``avro_to_arrow_schema`` / ``protobuf_to_arrow_schema``, then pyspark's Arrow-to-Spark mapping, as the
catalog's ``createDataFrame`` does)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyspark.sql.pandas.types import from_arrow_type

from pipeline.table.values import avro_to_arrow_schema, protobuf_to_arrow_schema

TABLE_MD = Path(__file__).resolve().parents[2] / "docs" / "table.md"


def mapping_rows(heading: str) -> list[tuple[str, str]]:
    """The (type, Spark column) rows of the docs/table.md section under ``heading`` (to the next heading)."""
    text = TABLE_MD.read_text()
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    section = text[start:end if end > 0 else len(text)]
    rows = re.findall(r"^\| `(.+?)` \| `(.+?)` \|$", section, flags=re.M)
    assert len(rows) >= 20, rows
    return rows


@pytest.mark.parametrize("avro, spark", mapping_rows("### Avro types as columns"))
def test_each_row_of_the_type_mapping_table(avro, spark):
    avro_type = json.loads(avro) if avro[0] in "[{" else avro
    schema = avro_to_arrow_schema({"type": "record", "name": "T", "fields": [{"name": "f", "type": avro_type}]})
    assert from_arrow_type(schema.field("f").type).simpleString() == spark
    assert schema.field("f").nullable


def test_a_union_of_several_types_is_refused_with_its_reason():
    with pytest.raises(ValueError, match="union"):
        avro_to_arrow_schema({"type": "record", "name": "T", "fields": [{"name": "f", "type": ["int", "string"]}]})


@pytest.mark.parametrize("proto, spark", mapping_rows("### Protobuf types as columns"))
def test_each_row_of_the_protobuf_type_mapping_table(proto, spark):
    schema = protobuf_to_arrow_schema(
        'syntax = "proto3";\nimport "google/protobuf/timestamp.proto";\nimport "google/protobuf/wrappers.proto";\n'
        f"message T {{ {proto} f = 1; }}\nenum E {{ A = 0; B = 1; }}\nmessage R {{ int32 x = 1; }}\n")
    assert from_arrow_type(schema.field("f").type).simpleString() == spark
    assert schema.field("f").nullable
