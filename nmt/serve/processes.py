"""LitServe's processes: worker loops that end quietly where the queues are gone, the log's
timeout advice in nmt serve's words, and a watch that tells how a process died."""

import logging
import multiprocessing
import signal
import threading
from typing import NoReturn

import litserve
from litserve.loops.simple_loops import BatchedLoop, SingleLoop

from nmt.errors import NMTError
from nmt.processes import how_it_ended


class QueuesGone:
    """A LitServe worker loop that ends quietly where the queues it reads are gone with
    LitServe's manager (the process that held them): the worker printed a 30-line traceback
    (EOFError, at ``request_queue.get``) above the server's one line that says the manager died.
    The worker ends as a finished one (status 0): the death is the manager's, which
    ``run_server`` reports; a status of 1 would blame the worker (``worker_death``)."""

    def __call__(self, *args, **kwargs) -> None:
        try:
            super().__call__(*args, **kwargs)
        except (EOFError, BrokenPipeError, ConnectionResetError):  # what a dead manager's queues raise
            return


class QuietSingleLoop(QueuesGone, SingleLoop):
    """LitServe's loop for a batch of one (``--max-batch 1``), ending quietly (``QueuesGone``)."""


class QuietBatchedLoop(QueuesGone, BatchedLoop):
    """LitServe's loop for batches, ending quietly (``QueuesGone``)."""


def worker_loop(max_batch: int) -> QueuesGone:
    """The loop LitServe would choose for ``max_batch`` (``get_default_loop``), ending quietly
    where its queues are gone."""
    return QuietBatchedLoop() if max_batch > 1 else QuietSingleLoop()


class TimeoutAdvice(logging.Filter):
    """LitServe's log line for each request it answers 504 ends with advice for its own API,
    "You can adjust the timeout by providing the `timeout` argument to LitServe(...,
    timeout=30).", which a user of nmt serve cannot act on: it names ``--timeout`` instead.
    Every record passes; that sentence alone is rewritten."""

    LITSERVE = "You can adjust the timeout by providing the `timeout` argument to LitServe(..., timeout=30)."
    OURS = "Raise the limit with nmt serve --timeout SECONDS (0: none)."

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and self.LITSERVE in record.msg:
            record.msg = record.msg.replace(self.LITSERVE, self.OURS)
        return True


def died(death: str) -> NoReturn:
    """The one-line error of a server stopped by the end of one of its processes."""
    raise NMTError(f"{death}, so the server stopped: start it again (in production, under a "
                   "supervisor that restarts it)") from None


class ProcessWatch:
    """LitServe's processes beside its inference workers (which it watches itself): its HTTP
    server (uvicorn, forked) and its manager (the process that holds its queues). Killed (the
    OOM killer), the HTTP server left ``nmt serve`` running, serving nothing (connections
    waited in the socket's queue, unanswered), and the manager left a traceback (EOFError).
    While LitServe runs, a thread looks at them every ``PERIOD`` seconds; where the HTTP
    server has died (``death``) with no stop asked for (Ctrl-C or SIGTERM, which this watch's
    handler notes) and no inference worker ended (LitServe's own shutdown), it stops LitServe
    as Ctrl-C would, and says why (``stopped``). The manager's end LitServe's main thread
    meets at once, at the queues (``run_server``). A process is known once seen running
    (``multiprocessing.active_children``, which forgets those that have ended): one that ends
    within ``PERIOD`` of its start may go unseen, as all did before."""

    PERIOD = 0.1

    def __init__(self, server: litserve.LitServer):
        self.server = server
        self.stopped: str | None = None  # the death that stopped LitServe, in words
        self._asked = False  # a stop (Ctrl-C, SIGTERM) came
        self._processes: list = []  # LitServe's processes other than its inference workers
        self._done = threading.Event()
        self._handlers: dict = {}

    def __enter__(self) -> "ProcessWatch":
        for sig in (signal.SIGINT, signal.SIGTERM):  # as Python's, noting the stop
            if signal.getsignal(sig) is signal.default_int_handler:  # not ignored (nohup)
                self._handlers[sig] = signal.signal(sig, self._interrupt)
        threading.Thread(target=self._watch, daemon=True, name="nmt-process-watch").start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)

    def _interrupt(self, signum: int, frame: object) -> None:
        self._asked = True
        raise KeyboardInterrupt

    def death(self) -> str | None:
        """How one of the processes watched died, in words; None where none did."""
        process = self._dead()
        if process is None:
            return None
        what = "the HTTP server" if is_http_server(process) else "LitServe's manager"
        return f"{what} process died ({how_it_ended(process.exitcode)})"

    def _dead(self) -> multiprocessing.Process | None:
        """One of the processes watched that died, if any. Ending at LitServe's SIGTERM, or
        with status 0, is not dying: LitServe's shutdown for another cause ends them so."""
        workers = getattr(self.server, "inference_workers", [])
        self._processes += [process for process in multiprocessing.active_children()
                            if process not in workers and process not in self._processes]
        return next((process for process in self._processes
                     if process.exitcode not in (None, 0, -signal.SIGTERM)), None)

    def _watch(self) -> None:
        while not self._done.wait(self.PERIOD):
            workers = getattr(self.server, "inference_workers", [])
            if (process := self._dead()) is None or self._asked \
                    or any(worker.exitcode is not None for worker in workers):
                continue
            if is_http_server(process) and signal.SIGTERM in self._handlers:
                self.stopped = self.death()
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # as a stop
            return


def is_http_server(process: multiprocessing.Process) -> bool:
    """Whether a process LitServe started is one of its HTTP servers (uvicorn), by the name
    LitServe gives them, LitServer-N (its manager is SyncManager-N)."""
    return process.name.startswith("LitServer")


def worker_death(server: object) -> str | None:
    """How an inference worker of ``server`` (LitServe's) ended, in words, where one ended of
    itself (killed by the out-of-memory killer, an error); None where none did. SIGTERM is
    LitServe's own: it terminates the workers as it shuts down for any other reason, which an
    error then was wrongly blamed on."""
    ended = [worker.exitcode for worker in getattr(server, "inference_workers", [])
             if worker.exitcode and worker.exitcode != -signal.SIGTERM]
    return how_it_ended(ended[0]) if ended else None
