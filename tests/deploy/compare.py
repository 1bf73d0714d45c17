"""Checks for tests/deploy/run.sh: the deployed stack serves the same rows as a local run, from one cache.

Needs only the standard library and pyarrow (the repo's .venv has both). Subcommands:

  wait URL [--timeout S]
      Poll URL until it answers 2xx.
  rows --remote URL --reference URL --dataset ID [--rounds N] [--concurrency C] [--expect-upstreams N] [--token T]
      Fetch a set of row picks (GET /rows and POST /rows/take) from the deployed stack many times, the first round
      all at once on a cold cache, and require each answer to equal, as an Arrow table, the one a local reference
      server gives, with the same X-Total-Rows/X-Start/X-Stop. The ETag of a pick must be the same whichever replica
      answers, and a conditional GET with it must give 304. With --expect-upstreams N, the X-Upstream header (set by
      deploy/nginx.conf) must name N distinct replicas. With --token, requests to the stack carry it, and the same
      requests without it (401) or with a wrong one (401/403) must be refused.
  source --reference URL --dataset ID --source DIR
      The reference server's rows equal the dataset's parquet files read directly with pyarrow.
  cache --listing FILE --source DIR
      FILE: JSON list of [path, size] of every file in the cache volume. Requires one segment directory per dataset
      and exactly one `.arrow` (with its `.json` sidecar) per source data parquet file, and no temporary file.

Exit status 0 when every check holds; 1 with a message per failed check otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

TIMEOUT_S = 120


@dataclass(frozen=True)
class Pick:
    """One request: GET /rows with `query`, or POST /rows/take with `body`."""

    name: str
    query: str = ""
    body: dict | None = None
    episodes: list[int] | None = None  # the episodes the pick selects (for the parquet check); None = all


@dataclass(frozen=True)
class Answer:
    table: pa.Table
    headers: dict[str, str]


def _request(url: str, *, body: dict | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=dict(headers or {}))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def _get_json(url: str, auth: dict[str, str] | None = None) -> dict:
    status, _, payload = _request(url, headers=auth)
    if status != 200:
        raise SystemExit(f"GET {url}: HTTP {status}: {payload[:300]!r}")
    return json.loads(payload)


def _fetch(base: str, dataset: str, pick: Pick, auth: dict[str, str] | None = None) -> Answer:
    url = f"{base}/datasets/{dataset}/rows"
    if pick.body is not None:
        status, headers, payload = _request(url + "/take", body=pick.body, headers=auth)
    else:
        status, headers, payload = _request(url + (f"?{pick.query}" if pick.query else ""), headers=auth)
    if status != 200:
        raise AssertionError(f"{pick.name}: {url} HTTP {status}: {payload[:300]!r}")
    if headers.get("content-type", "").split(";")[0] != "application/vnd.apache.arrow.stream":
        raise AssertionError(f"{pick.name}: content-type {headers.get('content-type')!r}")
    return Answer(pa.ipc.open_stream(payload).read_all(), headers)


def picks_for(episodes: int) -> list[Pick]:
    """Episode picks spread over the dataset: single, scattered, across a file boundary, the tail, slices, all."""
    n = episodes
    mid = max(1, n // 4)  # v3.0 demo: 50 episodes per data file, so n // 4 sits on a file boundary
    scattered = sorted({1, 3, 4, 5} & set(range(n))) or [0]
    picks = [
        Pick("one episode", "episodes=0", episodes=[0]),
        Pick("scattered", "episodes=" + ",".join(map(str, scattered)), episodes=scattered),
        Pick(
            "across a file boundary",
            f"episodes={max(0, mid - 2)}-{min(n - 1, mid + 2)}",
            episodes=list(range(max(0, mid - 2), min(n - 1, mid + 2) + 1)),
        ),
        Pick(
            "tail, some columns",
            f"episodes={max(0, n - 10)}-{n - 1}&columns=action,episode_index,index",
            episodes=list(range(max(0, n - 10), n)),
        ),
        Pick("slice of an episode", f"episodes={min(7, n - 1)}&start=5&stop=20"),
        Pick("everything", ""),
        Pick("take", body={"indices": [5, 0, 5, 17], "episodes": f"0-{min(n - 1, 9)}"}),
    ]
    return picks


def _same(pick: Pick, got: Answer, want: Answer) -> list[str]:
    problems = []
    if not got.table.schema.equals(want.table.schema, check_metadata=True):
        problems.append(f"{pick.name}: schema differs:\n  got  {got.table.schema}\n  want {want.table.schema}")
    elif not got.table.equals(want.table):
        bad = [c for c in want.table.column_names if not got.table.column(c).equals(want.table.column(c))]
        problems.append(f"{pick.name}: rows differ ({got.table.num_rows} vs {want.table.num_rows} rows; columns {bad})")
    for header in ("x-total-rows", "x-start", "x-stop"):
        if got.headers.get(header) != want.headers.get(header):
            problems.append(f"{pick.name}: {header} {got.headers.get(header)!r} != {want.headers.get(header)!r}")
    return problems


def cmd_wait(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(args.url, timeout=5) as response:
                if 200 <= response.status < 300:
                    return 0
                last = f"HTTP {response.status}"
        except Exception as error:  # connection refused, reset, HTTP 503 while starting...
            last = repr(error)
        time.sleep(0.5)
    print(f"FAIL: {args.url} not answering 2xx after {args.timeout} s: {last}", file=sys.stderr)
    return 1


def cmd_rows(args: argparse.Namespace) -> int:
    info = _get_json(f"{args.reference}/datasets/{args.dataset}")
    auth = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    remote_info = _get_json(f"{args.remote}/datasets/{args.dataset}", auth)
    problems = []
    for key in ("rows", "episodes", "columns", "format", "source_files"):
        if remote_info.get(key) != info.get(key):
            problems.append(f"/datasets/{args.dataset}: {key} {remote_info.get(key)!r} != {info.get(key)!r}")
    picks = picks_for(int(info["episodes"]))
    want = {pick.name: _fetch(args.reference, args.dataset, pick) for pick in picks}

    # Round 1 fires every pick `concurrency` times at once: cold segments get built by several replicas and
    # workers racing for the same file locks. Later rounds go one by one so round-robin visits every replica.
    jobs = [pick for pick in picks for _ in range(args.concurrency)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        answers = list(zip(jobs, pool.map(lambda p: _fetch(args.remote, args.dataset, p, auth), jobs), strict=True))
    cold_s = time.monotonic() - started
    for _ in range(args.rounds - 1):
        answers += [(pick, _fetch(args.remote, args.dataset, pick, auth)) for pick in picks]

    upstreams: collections.Counter[str] = collections.Counter()
    etags: dict[str, set[str]] = collections.defaultdict(set)
    for pick, answer in answers:
        problems += _same(pick, answer, want[pick.name])
        upstreams[answer.headers.get("x-upstream", "-")] += 1
        if pick.body is None:
            etags[pick.name].add(answer.headers.get("etag", ""))
    for name, tags in etags.items():
        if len(tags) != 1 or "" in tags:
            problems.append(f"{name}: ETag not the same on every replica: {sorted(tags)}")

    # A conditional GET (what an HTTP cache in front would send) must be answered 304, through any replica.
    pick = picks[1]
    (tag,) = etags[pick.name]
    for _ in range(max(3, args.expect_upstreams)):
        status, _, _ = _request(
            f"{args.remote}/datasets/{args.dataset}/rows?{pick.query}", headers={**auth, "If-None-Match": tag}
        )
        if status != 304:
            problems.append(f"conditional GET with ETag {tag}: HTTP {status}, expected 304")
            break
    if args.token:  # the same request without the token (401) or with a wrong one (401 or 403) is refused
        for wrong, expected in (({}, {401}), ({"Authorization": "Bearer not-the-token"}, {401, 403})):
            status, _, _ = _request(f"{args.remote}/datasets/{args.dataset}/rows?{pick.query}", headers=wrong)
            if status not in expected:
                problems.append(f"rows with Authorization {wrong or 'absent'}: HTTP {status}, expected {expected}")

    print(
        f"rows: {len(answers)} responses for {len(picks)} picks ({args.concurrency} concurrent per pick on the "
        f"cold cache: {cold_s:.1f} s), {sum(a.table.num_rows for _, a in answers)} rows compared; "
        f"upstreams {dict(upstreams)}"
    )
    if args.expect_upstreams:
        served = [u for u in upstreams if u != "-"]
        if len(served) < args.expect_upstreams:
            problems.append(f"X-Upstream named {len(served)} replicas ({served}); expected {args.expect_upstreams}")
    return _report(problems)


def _source_files(source: Path) -> list[Path]:
    return sorted(p for p in (source / "data").rglob("*.parquet") if p.is_file())


def cmd_source(args: argparse.Namespace) -> int:
    files = _source_files(Path(args.source))
    if not files:
        return _report([f"no data/**/*.parquet under {args.source}"])
    frames = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("index")
    info = _get_json(f"{args.reference}/datasets/{args.dataset}")
    problems = []
    if frames.num_rows != info["rows"]:
        problems.append(f"the parquet files hold {frames.num_rows} rows, /datasets says {info['rows']}")
    checked = 0
    for pick in picks_for(int(info["episodes"])):
        if pick.body is not None or "start=" in pick.query:
            continue
        got = _fetch(args.reference, args.dataset, pick).table
        expected = frames
        if pick.episodes is not None:
            expected = frames.filter(pc.is_in(frames["episode_index"], pa.array(pick.episodes, pa.int64())))
        expected = expected.select(got.column_names)
        if got.num_rows != expected.num_rows:
            problems.append(f"{pick.name}: {got.num_rows} rows served, {expected.num_rows} in the parquet files")
            continue
        for name in got.column_names:
            column = got[name]
            want = expected[name].cast(column.type) if expected[name].type != column.type else expected[name]
            if not column.equals(want):
                problems.append(f"{pick.name}: column {name} differs from the parquet files")
        checked += got.num_rows
    print(f"source: {checked} served rows equal the {len(files)} parquet files under {args.source}")
    return _report(problems)


def cmd_cache(args: argparse.Namespace) -> int:
    listing = [(PurePosixPath(path), size) for path, size in json.loads(Path(args.listing).read_text())]
    sources = _source_files(Path(args.source))
    problems = []
    temporary = [str(p) for p, _ in listing if ".tmp" in str(p)]
    if temporary:
        problems.append(f"temporary files left in the cache: {temporary}")
    segment_dirs = sorted({p.parent for p, _ in listing if p.parent.name == "segments"})
    arrows = [p for p, _ in listing if p.suffix == ".arrow"]
    sizes = dict(listing)
    if len(segment_dirs) != 1:
        problems.append(f"expected the segments of one dataset, found {len(segment_dirs)} dirs: {segment_dirs}")
    if len(arrows) != len(sources):
        problems.append(f"{len(arrows)} .arrow segments for {len(sources)} source parquet files: {arrows}")
    if len({p.name for p in arrows}) != len(arrows):
        problems.append(f"duplicate segment names: {arrows}")
    for arrow in arrows:
        if arrow.with_suffix(".json") not in sizes:
            problems.append(f"{arrow} has no .json sidecar")
        if sizes[arrow] == 0:
            problems.append(f"{arrow} is empty")
    print(
        f"cache: {len(arrows)} segments ({sum(sizes[a] for a in arrows) / 2**20:.1f} MiB) for {len(sources)} "
        f"source files, {len(listing)} files in the volume, no temporary file: {not temporary}"
    )
    return _report(problems)


def _report(problems: list[str]) -> int:
    for problem in problems[:50]:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    wait = commands.add_parser("wait")
    wait.add_argument("url")
    wait.add_argument("--timeout", type=float, default=120)
    rows = commands.add_parser("rows")
    rows.add_argument("--remote", required=True)
    rows.add_argument("--reference", required=True)
    rows.add_argument("--dataset", default="demo")
    rows.add_argument("--rounds", type=int, default=4)
    rows.add_argument("--concurrency", type=int, default=3)
    rows.add_argument("--expect-upstreams", type=int, default=0)
    rows.add_argument("--token", help="bearer token the deployed stack requires")
    source = commands.add_parser("source")
    source.add_argument("--reference", required=True)
    source.add_argument("--dataset", default="demo")
    source.add_argument("--source", required=True)
    cache = commands.add_parser("cache")
    cache.add_argument("--listing", required=True)
    cache.add_argument("--source", required=True)
    args = parser.parse_args(argv)
    handler = {"wait": cmd_wait, "rows": cmd_rows, "source": cmd_source, "cache": cmd_cache}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
