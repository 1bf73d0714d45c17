"""`CoalescedWrites` over a real asyncio transport (a connected socket pair): a small write waits for the next one
of the same event-loop turn and both leave in one system call; a lone write leaves by the end of the turn; large
writes are not held; close sends what is held; and the server answers a small request with head and body in one
segment the client receives in one read."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx

from app.api.coalesced_writes import HELD_BYTES, CoalescedWrites
from tests.support import ServerProcess


class _Sink(asyncio.Protocol):
    pass


async def _pair() -> tuple[CoalescedWrites, socket.socket, asyncio.Transport]:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(_Sink, sock=ours)
    return CoalescedWrites(transport, loop), theirs, transport


def _received(peer: socket.socket) -> bytes:
    peer.setblocking(False)
    data = b""
    try:
        while chunk := peer.recv(1 << 20):
            data += chunk
    except BlockingIOError:
        pass
    return data


def test_writes_of_one_turn_leave_together_and_a_lone_write_by_the_end_of_the_turn() -> None:
    async def scenario() -> None:
        writes, peer, transport = await _pair()
        writes.write(b"head;")
        assert _received(peer) == b""  # held until the next write or the end of the turn
        writes.write(b"body")
        assert _received(peer) == b"head;body"
        writes.write(b"lone")
        assert writes.get_write_buffer_size() == 4
        await asyncio.sleep(0)  # the end of the turn
        assert _received(peer) == b"lone"
        large = b"x" * (HELD_BYTES + 1)
        writes.write(large)  # not held
        await asyncio.sleep(0.05)
        assert len(_received(peer)) == len(large)
        writes.write(b"last")
        writes.close()  # sends what is held first
        await asyncio.sleep(0.05)
        assert _received(peer) == b"last"
        assert transport.is_closing()
        peer.close()

    asyncio.run(scenario())


def test_abort_drops_what_is_held() -> None:
    async def scenario() -> None:
        writes, peer, _ = await _pair()
        writes.write(b"held")
        writes.abort()
        await asyncio.sleep(0.05)
        assert _received(peer) == b""
        peer.close()

    asyncio.run(scenario())


def test_a_small_answer_arrives_head_and_body_in_one_read(datasets_root: Path, tmp_path: Path) -> None:
    with ServerProcess([datasets_root], tmp_path / "cache") as server:
        httpx.get(f"{server.url}/healthz", timeout=30).raise_for_status()
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            first = sock.recv(65536)
        head, _, body = first.partition(b"\r\n\r\n")
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        assert head.startswith(b"HTTP/1.1 200") and len(body) == length > 0
