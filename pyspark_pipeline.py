"""pipeline's Spark data sources, found by pyspark: it registers the ``DefaultSource`` of every
installed module named ``pyspark_*`` (``pyspark.sql.worker.lookup_data_sources``), so a session
whose Python has pipeline installed reads ``USING pipeline_live`` tables (the live view's tail,
``pipeline.table.live``) without any set-up. Kept light: Spark imports it in a Python process of
its own, the first time any Python data source is named in a JVM; the reader, with pyarrow and
kafka-python, is imported where a query of the tail is planned."""

from pyspark.sql.datasource import DataSource, DataSourceReader


class DefaultSource(DataSource):
    """The ``pipeline_live`` data source: the records the brokers serve, as rows of the records table
    or of a typed topic's table, the table's columns declared (``pipeline.table.live_source.LiveTailReader``)."""

    @classmethod
    def name(cls) -> str:
        return "pipeline_live"  # pipeline.table.live.SOURCE_NAME

    def schema(self) -> str:
        # pipeline.table.live.TABLE_COLUMNS's types (pipeline.table.schema.SPARK_SCHEMA), then the parameter
        return ("key binary, value binary, topic string, `partition` int, `offset` bigint, `timestamp` timestamp, "
                "timestampType int, headers array<struct<key: string, value: binary>>, `date` string, `hour` int, "
                "`_boundary` string")

    def reader(self, schema) -> DataSourceReader:
        from pipeline.table.live_source import LiveTailReader

        return LiveTailReader(self.options, schema)
