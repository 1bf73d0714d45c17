"""The `serve` command's supervisor: the server's workers always run under it, one worker included, so a worker's
death never takes the service down for more than a moment and is never silent.

A worker reads segments through memory maps. If someone truncates a mapped cache file between the per-request
check and the copy (a careless `cp`, a full disk, an operator), the kernel kills the worker with SIGBUS; native
code can crash it too (SIGSEGV), and the OOM killer can SIGKILL it. Guarantees, kept by the code below:

- A death is noticed the moment it happens: the supervisor waits on its workers' exit sentinels and health-check
  answers at once, rather than polling one worker after another (a health check in progress never delays it).
- The replacement serves within a fraction of a second: workers are forked from a process that has imported the
  app once (multiprocessing's fork server, the app preloaded), not spawned as fresh interpreters, which take
  seconds to import pyarrow, FastAPI and the app. Deaths in quick succession are each replaced as fast (a spawned
  warm standby would not be: the next one takes those seconds to load, and a second death meanwhile waits). The
  fork server has only imported modules (no connection, no thread of ours), which is what makes forking it safe;
  the supervisor, which validated the configuration and may have reached an object store, is never forked. It
  holds no listening socket and serves nothing: it is no worker, in logs or metrics. Should it die, its workers
  are killed and replaced through a new one.
- Each death is logged with its cause (`worker 1234 killed by SIGBUS (a mapped cache file was truncated?);
  starting another`) after the dying worker's `faulthandler` traceback (`app.main.app_from_environment`); the
  requests it had in flight get a dropped connection at once, which the client retries (GET and POST reads are
  idempotent), and connections waiting to be accepted are accepted by the other workers or the replacement. A dead
  worker's live gauges leave `/metrics`.
- A worker that does not answer a health check within `timeout_worker_healthcheck` is taken as hung, killed and
  replaced the same way. A worker that exits with uvicorn's STARTUP_FAILURE stops the server (the app, or its
  configuration, would fail the same way in every replacement).
- SIGTERM/SIGINT stop the workers; SIGHUP replaces them one by one, each once its replacement serves. Workers run
  the code the server started with (that is what the fork server has imported): updates take a restart.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import time
from multiprocessing import forkserver
from multiprocessing.connection import wait

from uvicorn._subprocess import subprocess_started
from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

log = logging.getLogger("episerve.supervisor")

_LIKELY_CAUSES = {
    signal.SIGBUS: "a mapped cache file was truncated?",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGKILL: "killed from outside: the kernel's OOM killer, or kill -9?",
    signal.SIGABRT: "an abort in native code",
}
_TICK_S = 0.5  # how often workers are pinged (a signal ends the wait at once)
_FORKS = multiprocessing.get_context("forkserver")
_LOST = 255  # the exit code multiprocessing reports for a worker whose fork server died before it


def death_cause(exitcode: int | None) -> str:
    """How a worker process ended, from its exit code (negative: the signal that killed it)."""
    if exitcode is None:
        return "stopped answering its health checks (killed)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        likely = _LIKELY_CAUSES.get(signal.Signals(-exitcode)) if -exitcode in signal.valid_signals() else None
        return f"killed by {name}" + (f" ({likely})" if likely else "")
    if exitcode == _LOST:
        return f"exited with status {exitcode} (or its fork server died)"
    return f"exited with status {exitcode}"


def _signal_wakeup() -> tuple[socket.socket, socket.socket]:
    """A pair of sockets whose first becomes readable when a signal arrives, so that a wait on the workers ends at
    once (SIGTERM stops the server without waiting for the tick). The second must stay open as long."""
    readable, writable = socket.socketpair()
    for end in (readable, writable):
        end.setblocking(False)
    signal.set_wakeup_fd(writable.fileno(), warn_on_full_buffer=False)
    return readable, writable


def _drain(readable: socket.socket) -> None:
    """Read what the signals wrote, so that the next wait blocks again."""
    with contextlib.suppress(BlockingIOError):
        while readable.recv(512):
            pass


def start_fork_server(app: str) -> None:
    """Start the fork server the workers will be forked from, preloading `app`'s module (`module:attribute`), at
    once: it imports the app while the supervisor reads its configuration."""
    _FORKS.set_forkserver_preload([app.partition(":")[0]])
    forkserver.ensure_running()


class Worker(Process):
    """uvicorn's worker process, forked from the fork server rather than spawned."""

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        super().__init__(config, sockets)
        kwargs = {"config": config, "target": self.target, "sockets": sockets, "stdin_fileno": None}
        self.process = _FORKS.Process(target=subprocess_started, kwargs=kwargs)  # in place of the spawned one

    def always_pong(self) -> None:  # pragma: no cover (the worker process)
        with contextlib.suppress(EOFError, OSError):
            super().always_pong()  # until the supervisor closes the pipe

    def kill(self) -> None:
        if self.exitcode == _LOST and self.pid is not None:
            # Its fork server died, not necessarily the worker, which then runs on unseen: make sure (by pid; it
            # was running a moment ago).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        super().kill()


class Supervisor(Multiprocess):
    """uvicorn's worker supervisor, used for any number of workers, that notices a death at once, replaces the
    worker from the fork server and says why it died."""

    deaths = 0
    failed_to_start = False

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        super().__init__(config, sockets)
        if isinstance(config.app, str):
            _FORKS.set_forkserver_preload([config.app.partition(":")[0]])
        self._pinged: dict[Process, float] = {}  # health checks sent and not answered yet: when
        self._answered: dict[Process, float] = {}  # when each worker last answered one
        self._signalled, self._signal_writer = _signal_wakeup()

    def run(self) -> None:
        """uvicorn's loop, which sleeps 0.5 s between checks, waiting on the workers instead."""
        log.info("started supervisor process [%d]", os.getpid())
        self.init_processes()
        while not self.should_exit.is_set():
            self.handle_signals()
            self.keep_subprocess_alive()
        self.terminate_all()
        self.join_all()
        log.info("stopping supervisor process [%d]", os.getpid())

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            self.processes.append(self._start_worker())

    def restart_all(self) -> None:
        """uvicorn's: each worker replaced by a new one once that one serves (here forked)."""
        for idx, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._start_worker()
            if not new.wait_until_ready(self.config.timeout_worker_healthcheck, self.should_exit):
                new.kill()
                new.join()
                if not self.should_exit.is_set():
                    log.error("worker %s was not ready in time; keeping worker %s, restart aborted", new.pid, old.pid)
                return
            old.terminate()
            old.join()
            self._retire(old)
            self.processes[idx] = new

    def handle_ttin(self) -> None:
        log.info("received SIGTTIN: one more worker")
        self.processes_num += 1
        self.processes.append(self._start_worker())

    def keep_subprocess_alive(self) -> None:
        """Wait up to a tick for a worker to exit or answer; replace the dead and the hung; ping the others."""
        if self.should_exit.is_set():
            return
        for gone in {*self._pinged, *self._answered} - set(self.processes):
            self._retire(gone)  # retired by SIGTTOU
        awaited = [process.parent_conn for process in self._pinged]
        sentinels = [process.process.sentinel for process in self.processes]
        ready = set(wait([*sentinels, *awaited, self._signalled], timeout=_TICK_S))
        if self._signalled in ready:
            _drain(self._signalled)  # the signal itself waits in uvicorn's queue for the next round
        now = time.monotonic()
        for process in self.processes:
            if process.parent_conn in ready:
                self._receive(process, now)
        for idx, process in enumerate(self.processes):
            dead = process.process.sentinel in ready
            if dead or now - self._pinged.get(process, now) > self.config.timeout_worker_healthcheck:
                self._replace(idx, hung=not dead)
                if self.should_exit.is_set():
                    return
        for process in self.processes:
            if process not in self._pinged and now - self._answered.get(process, 0.0) >= _TICK_S:
                with contextlib.suppress(OSError):  # dead: its sentinel says so next
                    process.parent_conn.send(b"ping")
                    self._pinged[process] = now

    def _start_worker(self) -> Worker:
        worker = Worker(self.config, self.sockets)
        worker.start()
        return worker

    def _receive(self, process: Process, now: float) -> None:
        with contextlib.suppress(OSError, EOFError):  # dead: its sentinel says so
            process.parent_conn.recv()
            self._pinged.pop(process, None)
            self._answered[process] = now

    def _replace(self, idx: int, hung: bool) -> None:
        process = self.processes[idx]
        process.kill()  # hung, or dead already
        process.join()
        self._retire(process)
        if process.exitcode == STARTUP_FAILURE:
            log.error("worker %s failed to start; stopping the server", process.pid)
            self.failed_to_start = True
            self.should_exit.set()
            return
        self.deaths += 1
        cause = death_cause(None if hung else process.exitcode)
        log.error("worker %s %s; starting another (%d worker deaths so far)", process.pid, cause, self.deaths)
        self.processes[idx] = self._start_worker()

    def _retire(self, process: Process) -> None:
        """Forget a worker that is gone: its health checks, and its live gauges, so that `/metrics` sums only
        those of workers that run."""
        self._pinged.pop(process, None)
        self._answered.pop(process, None)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and process.pid is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(process.pid)
