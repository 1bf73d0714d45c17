"""The `serve` command's supervisor: the server's workers always run as child processes of it, one worker
included, so a worker's death never takes the service down and is never silent.

A worker reads segments through memory maps. If someone truncates a mapped cache file between the per-request
size check and the copy (a careless `cp`, a full disk, an operator), the kernel kills the worker with SIGBUS;
native code can crash it too (SIGSEGV), and the OOM killer can SIGKILL it. The supervisor logs each death with
its cause (`worker 1234 killed by SIGBUS (a mapped cache file was truncated?); starting another`) and starts a new
worker on the same listening socket at once, so the service keeps answering; the requests the dead worker had in
flight get a dropped connection, which the client retries (GET and POST reads are idempotent). Workers run with
`faulthandler` enabled (`app.main.app_from_environment`), so a fatal signal also logs the Python traceback of
every thread of the dying worker.
"""

from __future__ import annotations

import logging
import signal

from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

log = logging.getLogger("episerve.supervisor")

_LIKELY_CAUSES = {
    signal.SIGBUS: "a mapped cache file was truncated?",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGKILL: "killed from outside: the kernel's OOM killer, or kill -9?",
    signal.SIGABRT: "an abort in native code",
}


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
    return f"exited with status {exitcode}"


class Supervisor(Multiprocess):
    """uvicorn's worker supervisor, used for any number of workers, that says why each worker died."""

    deaths = 0
    failed_to_start = False

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        for idx, process in enumerate(self.processes):
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            hung = process.exitcode is None  # alive, but it did not answer the health check in time
            process.kill()
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                log.error("worker %s failed to start; stopping the server", process.pid)
                self.failed_to_start = True
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            self.deaths += 1
            cause = death_cause(None if hung else process.exitcode)
            log.error("worker %s %s; starting another (%d worker deaths so far)", process.pid, cause, self.deaths)
            replacement = Process(self.config, self.sockets)
            replacement.start()
            self.processes[idx] = replacement
