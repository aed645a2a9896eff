"""pipeline's Spark data sources, found by pyspark: it registers the ``DefaultSource`` of every
installed module named ``pyspark_*`` (``pyspark.sql.worker.lookup_data_sources``), so a session
whose Python has pipeline installed reads ``USING pipeline_live`` tables (the live view's tail,
``pipeline.table.live``) without any set-up."""

from pipeline.table.live_source import LiveTail as DefaultSource

__all__ = ["DefaultSource"]
