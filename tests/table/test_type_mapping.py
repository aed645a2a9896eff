"""docs/table.md's "Avro types as columns" table is what the typed tables do: each row's Avro type, as
a record's one field, becomes the Spark column type the row names (``avro_to_arrow_schema``, then
pyspark's Arrow-to-Spark mapping, as the catalog's ``createDataFrame`` does)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyspark.sql.pandas.types import from_arrow_type

from pipeline.table.values import avro_to_arrow_schema

TABLE_MD = Path(__file__).resolve().parents[2] / "docs" / "table.md"


def mapping_rows() -> list[tuple[str, str]]:
    text = TABLE_MD.read_text()
    start = text.index("### Avro types as columns")
    section = text[start:text.index("\n#", start)]  # to the next heading
    rows = re.findall(r"^\| `(.+?)` \| `(.+?)` \|$", section, flags=re.M)
    assert len(rows) >= 20, rows
    return rows


@pytest.mark.parametrize("avro, spark", mapping_rows())
def test_each_row_of_the_type_mapping_table(avro, spark):
    avro_type = json.loads(avro) if avro[0] in "[{" else avro
    schema = avro_to_arrow_schema({"type": "record", "name": "T", "fields": [{"name": "f", "type": avro_type}]})
    assert from_arrow_type(schema.field("f").type).simpleString() == spark
    assert schema.field("f").nullable


def test_a_union_of_several_types_is_refused_with_its_reason():
    with pytest.raises(ValueError, match="union"):
        avro_to_arrow_schema({"type": "record", "name": "T", "fields": [{"name": "f", "type": ["int", "string"]}]})
