"""Where the broker's metadata lives: SQLite files on one machine, or one PostgreSQL database for brokers
on several hosts (``pipeline.metadata.url``). ``database`` is the seam both backends share; the stores of
topics, groups, users, ACLs and transactions run their SQL on it, and ``producer_ids`` and ``brokers``
hold what only a shared database can give: producer-id blocks and broker membership with leases."""
