"""An Arrow Flight server over loopback serving the same memory-mapped data as the server: the RPC peer.

Tickets are JSON: `{"dataset": name, "start": a, "stop": b}` for a contiguous range or
`{"dataset": name, "indices": [...]}` for a take, optionally with `"columns"`. Run it as
`python -m bench.peers.flight --port P name=path/to/file.arrow ...`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight

from bench.peers.ipc import MmapTable


class RangeTakeServer(flight.FlightServerBase):
    """do_get over memory-mapped tables: a zero-copy range, or a batch-grouped take."""

    def __init__(self, location: str, tables: dict[str, MmapTable]) -> None:
        super().__init__(location)
        self.tables = tables

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.RecordBatchStream:
        request = json.loads(ticket.ticket)
        table = self.tables[request["dataset"]]
        columns = request.get("columns")
        if "indices" in request:
            result = table.take(request["indices"], columns)
        else:
            result = table.slice(int(request["start"]), int(request["stop"]), columns)
        return flight.RecordBatchStream(result)


class FlightReader:
    """A pyarrow Flight client for `RangeTakeServer`."""

    label = "Arrow Flight"

    def __init__(self, port: int) -> None:
        self.client = flight.connect(f"grpc://127.0.0.1:{port}")

    def _get(self, request: dict) -> pa.Table:
        return self.client.do_get(flight.Ticket(json.dumps(request).encode())).read_all()

    def rows(self, dataset: str, start: int, stop: int, columns: Sequence[str] | None = None) -> pa.Table:
        return self._get({"dataset": dataset, "start": start, "stop": stop, "columns": columns})

    def take(self, dataset: str, indices: Sequence[int], columns: Sequence[str] | None = None) -> pa.Table:
        return self._get({"dataset": dataset, "indices": [int(i) for i in indices], "columns": columns})

    def close(self) -> None:
        self.client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("tables", nargs="+", help="name=path of an Arrow IPC file")
    args = parser.parse_args()
    tables = {}
    for item in args.tables:
        name, path = item.split("=", 1)
        tables[name] = MmapTable(Path(path))
    RangeTakeServer(f"grpc://127.0.0.1:{args.port}", tables).serve()


if __name__ == "__main__":
    main()
