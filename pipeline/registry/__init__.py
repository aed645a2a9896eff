"""pipeline's Schema Registry: Confluent's REST API (subjects, versions, ids, compatibility, modes)
served on its own HTTP port, its schemas kept in the metadata database so every broker serves one
registry (issue 32).

- ``store``: the schemas, subject versions, compatibility levels and modes in the metadata
  database (SQLite on one machine, PostgreSQL across hosts); blocking calls.
- ``compatibility``: the compatibility levels and checks (Avro through Apache Avro's
  ``ReaderWriterCompatibilityChecker``).
- ``service``: the REST API's operations, free of HTTP: arguments in, JSON-able values out,
  ``RegistryError`` (Confluent's ``error_code`` and HTTP status) when refused.
- ``http``: the HTTP layer (starlette routes on hypercorn's trio worker; TLS; basic authentication).
"""
