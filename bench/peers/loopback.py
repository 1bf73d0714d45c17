"""The TCP loopback ceiling: a server that answers an 8-byte length with that many bytes from memory.

The client receives into a reused buffer with `recv_into`, so the figure is what the kernel's loopback path
delivers to one Python reader, with no protocol and no decoding. Run as `python -m bench.peers.loopback --port P`.
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading

_PAYLOAD = bytes(64 * 1024 * 1024)


def _serve_connection(conn: socket.socket) -> None:
    view = memoryview(_PAYLOAD)
    with conn:
        while True:
            head = conn.recv(8, socket.MSG_WAITALL)
            if len(head) < 8:
                return
            remaining = struct.unpack("<Q", head)[0]
            while remaining:
                chunk = min(remaining, len(view))
                conn.sendall(view[:chunk])
                remaining -= chunk


class LoopbackReader:
    """One connection; `read(n)` asks for n bytes and receives them into a reused buffer."""

    label = "TCP loopback (raw recv_into)"

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buffer = bytearray(1 << 20)

    def read(self, size: int) -> None:
        if len(self.buffer) < size:
            self.buffer = bytearray(size)
        view = memoryview(self.buffer)
        self.sock.sendall(struct.pack("<Q", size))
        position = 0
        while position < size:
            received = self.sock.recv_into(view[position:size])
            if received == 0:
                raise ConnectionError("loopback server closed the connection")
            position += received

    def close(self) -> None:
        self.sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with socket.create_server(("127.0.0.1", args.port)) as server:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=_serve_connection, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
