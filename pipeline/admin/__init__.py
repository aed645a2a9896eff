"""Topic administration the way Kafka's AdminClient and CLI tools expect.

``store``: topics and config overrides in SQLite. ``topic_configs``: the topic
configs honoured, their validation and descriptions. ``apis``: CreateTopics,
DeleteTopics, CreatePartitions, DescribeConfigs, IncrementalAlterConfigs and
DescribeCluster, registered on ``KafkaApis``.
"""
