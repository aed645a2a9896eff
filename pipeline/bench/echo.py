"""The framing ceiling: a minimal trio server that answers every frame, and nothing else.

    python -m pipeline.bench.echo [--listen 127.0.0.1:0]

prints ``listening on HOST:PORT`` when ready and stops on SIGTERM/SIGINT.

Per connection it does only what any Kafka front end on trio must do: read
with ``receive_some``, cut frames with the server's own ``FrameDecoder``, and
answer each frame with a small frame of the shape of a Produce v9 response
(48 bytes: the request's correlation id followed by filler), coalescing the
replies to everything one read delivered into one ``send_all``. No header
parsing, no queues, no handlers, no persistence. Its requests/s under a given
load shape is what this machine, trio and Python allow before any Kafka work;
``pipeline bench`` states every result as a fraction of it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

import trio

from pipeline.network.framing import FrameDecoder

REPLY_BODY_BYTES = 44
"""Reply size after the correlation id: a one-partition Produce v9 response is 48 bytes in all."""
RECEIVE_BYTES = 256 * 1024


def replies_for(frames: Sequence[bytes | bytearray]) -> bytes:
    """One buffer answering ``frames`` (request frame bodies) in order.

    Each reply is a size prefix, the request's correlation id (bytes 4-8 of
    the request body: api_key int16, api_version int16, correlation_id int32),
    and ``REPLY_BODY_BYTES`` zero bytes. A frame shorter than 8 bytes gets
    correlation id -1.
    """
    size = (4 + REPLY_BODY_BYTES).to_bytes(4, "big")
    filler = bytes(REPLY_BODY_BYTES)
    parts = []
    for f in frames:
        cid = f[4:8] if len(f) >= 8 else b"\xff\xff\xff\xff"
        parts.append(size + cid + filler)
    return b"".join(parts)


async def serve_connection(stream: trio.SocketStream) -> None:
    decoder = FrameDecoder()
    async with stream:
        try:
            while True:
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    return
                decoder.receive_data(data)
                frames = []
                while (frame := decoder.next_frame()) is not None:
                    frames.append(frame)
                if frames:
                    await stream.send_all(replies_for(frames))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return


async def serve(host: str, port: int) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_host, bound_port = listeners[0].socket.getsockname()[:2]
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, serve_connection, listeners)
            print(f"echo: listening on {bound_host}:{bound_port}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def host_port(text: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (argparse type)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.echo", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=host_port, default=("127.0.0.1", 0), metavar="HOST:PORT")
    args = parser.parse_args(argv)
    trio.run(serve, *args.listen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
