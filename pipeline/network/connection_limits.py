"""The limits of one connection and their defaults, read by ``pipeline.config`` for its keys.

``pipeline.network.connection_state.ConnectionLimits`` holds them and ``ConnectionState`` applies
them (where each rule comes from is in its docstring). They live here, away from it, so that the
configuration (and with it every ``pipeline`` command) loads without the protocol layer (kio,
kafka-python) that the connection's rules need.
Times in ms, sizes in bytes, as Kafka's properties are.
"""

from __future__ import annotations

from typing import Final

DEFAULT_MAX_IN_FLIGHT: Final = 64
"""Requests per connection read but not yet answered (AutoMQ's cap)."""
DEFAULT_IDLE_TIMEOUT_MS: Final = 600_000
"""Kafka ``connections.max.idle.ms``: 10 minutes."""
DEFAULT_RECEIVE_TIMEOUT_MS: Final = 30_000
"""Time a request frame may take from its first byte to its last, while read (ms)."""
DEFAULT_SEND_TIMEOUT_MS: Final = 30_000
"""Time responses may wait for a client that does not read them (ms)."""
DEFAULT_RESPONSE_BUFFER_MAX_BYTES: Final = 1024 * 1024
"""Unsent response bytes per connection above which reading pauses."""
