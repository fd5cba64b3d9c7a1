"""A LitServer built from run (or export) directories, checked before any worker starts;
``serve`` runs it until Ctrl-C or SIGTERM, its failures as one-line errors."""

import math
import os
import signal
import socket
from collections.abc import Sequence
from pathlib import Path

import litserve
import torch
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from nmt.config import DECODING_PRECISIONS, load_config
from nmt.data.tokenizer import Tokenizer
from nmt.engines import check_engine_options
from nmt.errors import NMTError, stopped_cleanly
from nmt.serve.api import BATCH_TIMEOUT, TranslationAPI
from nmt.serve.models import model_info, model_name, served_models
from nmt.serve.page import add_page
from nmt.serve.processes import ProcessWatch, died, worker_death
from nmt.serve.request import MAX_BEAM, bad_body, http_error
from nmt.translator import check_ensemble, check_run_weights, decoding_options

HOSTS = ("127.0.0.1", "0.0.0.0", "::")
HOST_NAMES = {"localhost": "127.0.0.1"}  # LitServe takes addresses only
MAX_PAYLOAD = 1_000_000  # bytes


def build_server(paths: list[str], engine: str = "torch", beam: int = 5,
                 max_batch: int = 32, timeout: float = 120.0, weights: str | None = None,
                 precision: str | None = None, ensemble: Sequence[str] = ()) -> litserve.LitServer:
    """A LitServer for the given run (or export) directories; ``run`` it to serve. ``weights``
    (a checkpoint file of each run, e.g. averaged.ckpt), ``precision`` and ``ensemble`` (more
    runs that decode with the one in ``paths``, as one model named after it) as for translate;
    ``timeout``: seconds a request may wait in LitServe's queue before its 504 (0: no limit)."""
    check_engine_options(engine, weights, precision, ensemble)  # now, not in a worker
    if not 1 <= beam <= MAX_BEAM:
        raise NMTError(f"--beam must be from 1 to {MAX_BEAM}, got {beam}")
    if not (timeout == 0 or BATCH_TIMEOUT < timeout < math.inf):  # LitServe refuses a shorter one
        raise NMTError(f"--timeout must be 0 (no limit) or a number of seconds over "
                       f"{BATCH_TIMEOUT}, got {timeout}")
    if ensemble and len(paths) > 1:
        raise NMTError("--ensemble serves one model: give one --checkpoint with it")
    runs = served_models(paths, engine)
    if engine == "torch":  # weights that cannot load: one line now, not an error in a worker
        for path in runs.values():
            found = check_run_weights(path, weights)
            if len(runs) > 1 and not found.resolve().is_relative_to(Path(path).resolve()):
                raise NMTError(f"--weights {weights} with several --checkpoint names a file in "
                               f"each run (e.g. averaged.ckpt), but {path} has none: every model "
                               f"would serve {found}")
    else:  # an export that cannot load: as the run's weights
        try:
            from nmt.ctranslate2_translator import check_export
        except ImportError:
            raise NMTError('the ctranslate2 engine needs CTranslate2: pip install -e ".[export]"'
                           ) from None
        for path in runs.values():
            check_export(path)
    for path in runs.values():  # what the worker's warm-up would refuse: one line now
        vocab = len(Tokenizer(Path(path) / "spm.model"))
        check_decoding_config(load_config(Path(path) / "config.yaml"), engine, beam, precision, vocab)
    if ensemble:
        check_ensemble(paths[0], ensemble, weights)
        for member in ensemble:  # the worker loads them too: as the run's own, checked now
            check_run_weights(member, weights)
    info = [model_info(name, path, engine, ensemble) for name, path in runs.items()]
    api = TranslationAPI(runs, engine, beam, max_batch, weights, precision, ensemble)
    # cuda or cpu, never LitServe's "auto" pick of Apple's mps, which our models do not run on
    accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    server = litserve.LitServer(api, accelerator=accelerator, timeout=timeout or False,
                                max_payload_size=MAX_PAYLOAD,
                                model_metadata={"models": info, "default_beam": beam})
    server.app.add_exception_handler(RequestValidationError, bad_body)
    server.app.add_exception_handler(HTTPException, http_error)
    add_page(server.app)
    return server


def check_decoding_config(config, engine: str, beam: int, precision: str | None,
                          vocab: int) -> None:
    """A served model's decoding options (its config's, a hand-edited one's too) and --beam
    against its ``vocab`` size, as ``Translator.translate`` and ``decoding_precision`` check them
    in the worker, where a refusal was a traceback in the log and then "the server could not
    start" without why."""
    decoding_options(config.decoding, beam, 1, None, vocab)
    chosen = precision or config.decoding.precision
    if engine == "torch" and chosen not in DECODING_PRECISIONS:
        raise NMTError(f"unknown decoding precision '{chosen}'; choose from: "
                       f"{', '.join(DECODING_PRECISIONS)}")


def check_port_free(host: str, port: int) -> None:
    """A one-line error now rather than uvicorn's exit after the model has loaded."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as err:
            raise NMTError(f"cannot listen on {host}:{port}: {err.strerror}") from None


def serve(paths: list[str], host: str = "127.0.0.1", port: int = 8000, engine: str = "torch",
          beam: int = 5, max_batch: int = 32, weights: str | None = None,
          precision: str | None = None, ensemble: Sequence[str] = (), timeout: float = 120.0) -> None:
    """Serve until Ctrl-C or SIGTERM, which stop LitServe's worker processes too and end the
    command as a finished one, whether the models were still loading or served: LitServe
    ends so once it serves, and a supervisor's stop (systemd, Kubernetes) is a clean end."""
    host = HOST_NAMES.get(host, host)
    if host not in HOSTS:
        raise NMTError(f"--host must be one of {', '.join(HOSTS)} or localhost (LitServe binds "
                       "only these)")
    if not 1024 <= port <= 65535:
        raise NMTError(f"--port must be from 1024 to 65535, got {port}")
    if max_batch < 1:
        raise NMTError(f"--max-batch must be at least 1, got {max_batch}")
    check_port_free(host, port)
    # SIGTERM as Ctrl-C from here on, the checks included: LitServe then stops its worker
    # processes. Its forked HTTP server keeps the default, so that LitServe's own terminate()
    # ends it quietly.
    with stopped_cleanly():
        os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
        server = build_server(paths, engine, beam, max_batch, timeout, weights, precision, ensemble)
        address = f"[{host}]" if ":" in host else host  # an IPv6 address is bracketed in a URL
        print(f"serving {', '.join(map(model_name, paths))} with {engine} "
              f"at http://{address}:{port}/", flush=True)
        run_server(server, host, port)


def run_server(server: litserve.LitServer, host: str, port: int) -> None:
    """LitServe's ``run``, its failures as one-line errors. A stop (Ctrl-C, SIGTERM) while
    the workers load stops them and is raised on; once serving, LitServe handles it."""
    with ProcessWatch(server) as watch:
        try:
            server.run(host=host, port=port, generate_client_file=False, log_level="warning")
        except RuntimeError as err:  # LitServe's "workers failed to start": the log says why
            raise NMTError(f"the server could not start: {err}".splitlines()[0]) from None
        except KeyboardInterrupt:  # SIGTERM or Ctrl-C while the workers load: LitServe stops
            # them only once it serves, and Python's exit waited for them to load (seconds to
            # minutes; a container's stop timed out), then their traceback at the queues it
            # had shut down
            for worker in getattr(server, "inference_workers", []):
                worker.terminate()
            raise
        except (EOFError, OSError):  # at LitServe's queues, shut down as its worker died, or
            # gone with the manager that held them
            if (death := worker_death(server)) is not None:
                died(f"the inference worker died ({death})")
            if (death := watch.death()) is not None:
                died(death)
            raise
    if watch.stopped is not None:  # the HTTP server's end, which stopped LitServe
        died(watch.stopped)
