"""``nmt serve``: translation over HTTP with LitServe, and a page that shows the attention.

A thin adapter around ``Translator`` (or ``export.CTranslate2Translator``). LitServe runs one
inference worker; requests that arrive within ``BATCH_TIMEOUT`` seconds of each other (up to
``max_batch`` of them) reach ``predict`` together, and the texts of all those that ask for
the same model, beam and attention are decoded in one ``translate`` call: one batched beam
search per length bucket.

    POST /translate  {"text": ["...", ...], "beam": 5, "attention": false, "model": NAME}
                     (all but text optional; null, as a field left out, is the default)
        -> {"model": NAME, "translations": ["...", ...],
            "attention": [{"source": [...], "target": [...], "weights": [[...]]}, ...],  # if asked
                                                               # (each null for an ensemble)
            "warnings": ["text 2 has 900 pieces; truncated to 511"]}                       # if any
    GET /health      "ok" once the worker is ready (LitServe's)
    GET /info        {"model": {"models": [{name, family, attention, src_lang, tgt_lang,
                      parameters, engine, [members]}, ...], ...}, "server": {...}} (LitServe's)
    GET /            the web page (nmt/web/)

A bad request gets a 400 with {"error": "<one line>"}. It is checked in the worker but never
raises there: LitServe answers every request of a batch with the error a batch raises, so a
rejected request travels through the batch as a ``Rejected`` and only its own answer is a 400.
"""

import json
import logging
import math
import multiprocessing
import os
import signal
import socket
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, NoReturn

import litserve
import torch
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from litserve.loops.simple_loops import BatchedLoop, SingleLoop
from pydantic import AfterValidator
from starlette.exceptions import HTTPException

from nmt.attention_stats import attention_matrix
from nmt.config import DECODING_PRECISIONS, load_config, refuse_checkpoint_file
from nmt.data.tokenizer import EOS_PIECE, Tokenizer
from nmt.engines import check_engine_options, load_translator
from nmt.errors import NMTError, stopped_cleanly
from nmt.files import is_export
from nmt.models import build_model, scorer_of
from nmt.processes import how_it_ended
from nmt.translator import check_ensemble, check_run_weights, decoding_options, source_limit

HOSTS = ("127.0.0.1", "0.0.0.0", "::")
FIELDS = ("text", "beam", "attention", "model")
MAX_TEXTS = 64  # texts per request: more would hold up everyone batched with it
MAX_PIECES = 4096  # source pieces per request (after truncation), for the same reason
MAX_BEAM = 16
BATCH_TIMEOUT = 0.02  # seconds the worker waits for more requests to batch with
MAX_PAYLOAD = 1_000_000  # bytes
PAGE_FILES = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript")}
MAX_DEPTH = 8  # how deep a body's arrays and objects may nest; {"text": ["..."]} needs 2


def shallow(body: dict) -> dict:
    """``body`` if its arrays and objects nest at most ``MAX_DEPTH`` deep. FastAPI checks it in
    the HTTP process (``RequestBody``), before LitServe pickles the body for its worker, where
    a few hundred levels overflowed pickle's recursion: a 500, and a traceback in the log."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"the body nests deeper than {MAX_DEPTH} levels; send a JSON object "
                             'like {"text": ["..."]}')
        items = value.values() if isinstance(value, dict) else value
        stack.extend((item, depth + 1) for item in items if isinstance(item, (dict, list)))
    return body


RequestBody = Annotated[dict, AfterValidator(shallow)]  # a JSON object, parsed by FastAPI


@dataclass
class Job:
    """A valid request: what to translate, with which model and how."""

    texts: list[str]
    beam: int
    attention: bool
    model: str
    warnings: list[str] = field(default_factory=list)  # texts cut to the model's length


@dataclass
class Rejected:
    """A request that failed validation (400), or whose decoding failed (500)."""

    message: str
    status: int = 400


def parse_request(body: Any, models: list[str], default_beam: int) -> Job | Rejected:
    """Check a decoded JSON body field by field; the first problem found is the message."""
    if not isinstance(body, dict):
        return Rejected('the body must be a JSON object like {"text": ["..."]}')
    unknown = [key for key in body if key not in FIELDS]
    if unknown:
        return Rejected(f"unknown field {quoted(unknown[0])}; valid fields: {', '.join(FIELDS)}")
    texts, beam = body.get("text"), optional(body, "beam", default_beam)
    attention, model = optional(body, "attention", False), optional(body, "model", models[0])
    if "text" not in body:
        return Rejected("missing field 'text': a list of strings to translate")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        return Rejected("'text' must be a list of strings")
    if not 1 <= len(texts) <= MAX_TEXTS:
        return Rejected(f"'text' must hold 1 to {MAX_TEXTS} strings, got {len(texts)}")
    for number, text in enumerate(texts, start=1):
        if not _is_unicode(text):
            return Rejected(f"text {number} is not valid Unicode (a lone surrogate escape)")
    whole_beam = integral(beam)
    if type(whole_beam) is not int or not 1 <= whole_beam <= MAX_BEAM:  # bool is an int: excluded
        return Rejected(f"'beam' must be an integer from 1 to {MAX_BEAM}, got {quoted(beam)}")
    if not isinstance(attention, bool):
        return Rejected(f"'attention' must be true or false, got {quoted(attention)}")
    if model not in models:
        return Rejected(f"unknown model {quoted(model)}; served: {', '.join(map(quoted, models))}")
    return Job(texts, whole_beam, attention, model)


def optional(body: dict, key: str, default: Any) -> Any:
    """An optional field's value: ``default`` where it is left out or null, as a form's empty
    box sends it (the page's beam box, cleared, sent null and got a 400)."""
    value = body.get(key)
    return default if value is None else value


def integral(value: Any) -> Any:
    """A float that is a whole number (``2.0``) as the integer it is: JSON clients often send
    every number as a float (JavaScript has no other), and ``"beam": 2.0`` got a 400. Any
    other value is returned as it is, for its field's check to refuse (``2.5``) or take."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def quoted(value: Any) -> str:
    """``value`` as JSON writes it, a lone surrogate escaped too: a client's key or model name
    in an error can break neither the answer's UTF-8 (a 500 for every request batched with it)
    nor its one line."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "backslashreplace").decode("utf-8")


def _is_unicode(text: str) -> bool:
    """False for JSON's lone surrogates ("\\ud800"), which SentencePiece cannot take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def attention_view(translation) -> dict | None:
    """The best translation's cross-attention as JSON: source pieces across, target down."""
    if translation.attention is None:
        return None
    weights = attention_matrix(translation.attention)  # (T, S), mean over the last layer's heads
    target = (translation.pieces + [EOS_PIECE])[: weights.size(0)]
    return {"source": translation.source, "target": target,
            "weights": [[round(w, 4) for w in row] for row in weights.tolist()]}


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


class TranslationAPI(litserve.LitAPI):
    """LitServe's view of our translators: decode_request -> predict (batched) -> response."""

    def __init__(self, runs: dict[str, str], engine: str, default_beam: int, max_batch: int,
                 weights: str | None = None, precision: str | None = None,
                 ensemble: list[str] = ()):
        super().__init__(max_batch_size=max_batch, batch_timeout=BATCH_TIMEOUT,
                         api_path="/translate", loop=worker_loop(max_batch))
        self.runs, self.engine, self.default_beam = runs, engine, default_beam
        # as translate's --weights, --precision and --ensemble (the one run's members)
        self.weights, self.precision, self.ensemble = weights, precision, list(ensemble)

    def setup(self, device: str) -> None:
        """Load every model and translate one sentence with each, so that one-time costs
        (kernel initialisation, first allocations: seconds on a CPU) are paid before /health
        says ready, not by the first requests. Runs in LitServe's worker process."""
        # Ctrl-C reaches the terminal's whole process group: this worker too, where Python's
        # KeyboardInterrupt printed a 25-line traceback over the server's quiet exit. It ends
        # quietly instead, as on SIGTERM (how the server's own shutdown stops it); not ignored,
        # as a worker left running would keep a server interrupted while starting from exiting.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        logging.getLogger(SingleLoop.__module__).addFilter(TimeoutAdvice())  # its loops' logger
        # auto's precision for a batch of requests at --beam (a request may name another)
        self.translators = {name: load_translator(path, self.engine, device, self.weights,
                                                  self.precision, self.max_batch_size,
                                                  self.default_beam, self.ensemble)
                            for name, path in self.runs.items()}
        for translator in self.translators.values():
            translator.translate(["warm-up"], self.default_beam)

    def decode_request(self, request: RequestBody) -> Job | Rejected:
        job = parse_request(request, list(self.runs), self.default_beam)
        return self._measure(job) if isinstance(job, Job) else job

    def _measure(self, job: Job) -> Job | Rejected:
        """The job with a warning for each text cut to the model's length; a 413 where its
        texts hold more than ``MAX_PIECES`` pieces even so (it would hold up every request
        batched with it: 64 texts of 511 pieces take minutes at beam 16 on a CPU)."""
        translator = self.translators[job.model]
        full = translator.tokenizer.encode(job.texts)
        limit = source_limit(translator.max_positions)  # as translate will cut them
        kept = [min(len(ids), limit) for ids in full]
        if sum(kept) > MAX_PIECES:
            return Rejected(f"the texts hold {sum(kept):,} pieces; at most {MAX_PIECES:,} per "
                            "request: send fewer or shorter texts", 413)
        job.warnings = [f"text {number} has {len(ids)} pieces; truncated to {length}"
                        for number, (ids, length) in enumerate(zip(full, kept), start=1)
                        if length < len(ids)]
        return job

    def predict(self, items: list[Job | Rejected] | Job | Rejected
                ) -> list[dict | Rejected] | dict | Rejected:
        """Group the jobs by (model, beam, attention); one ``translate`` call per group.
        With max_batch_size 1, LitServe hands over each request alone, and takes its answer."""
        if not isinstance(items, list):
            return self.predict([items])[0]
        outputs: list[dict | Rejected] = list(items)
        groups: dict[tuple, list[int]] = {}
        for position, item in enumerate(items):
            if isinstance(item, Job):
                groups.setdefault((item.model, item.beam, item.attention), []).append(position)
        for positions in groups.values():
            jobs = [items[p] for p in positions]
            for position, answer in zip(positions, self._translate_group(jobs)):
                outputs[position] = answer
        return outputs

    def _translate_group(self, jobs: list[Job]) -> list[dict | Rejected]:
        """One ``translate`` call for jobs sharing model, beam and attention; its answers are
        split back in job order. A failure fails these jobs only, not the whole batch."""
        texts = [text for job in jobs for text in job.texts]
        first = jobs[0]
        # An ensemble's answers carry no attention: it would be its first run's alone.
        need_attn = first.attention and not self.ensemble
        try:
            results = self.translators[first.model].translate(  # warnings: in each answer
                texts, first.beam, need_attn=need_attn, warn=False)
        except Exception as err:  # whatever it is, it must not fail the other requests
            return [Rejected(f"translation failed: {type(err).__name__}: {err}".splitlines()[0], 500)
                    for _ in jobs]
        answers, start = [], 0
        for job in jobs:
            answers.append(self._answer(job, [hyps[0] for hyps in results[start : start + len(job.texts)]]))
            start += len(job.texts)
        return answers

    def unbatch(self, output: list) -> list:
        return output

    def _answer(self, job: Job, translations: list) -> dict:
        answer: dict[str, Any] = {"model": job.model, "translations": [t.text for t in translations]}
        if job.attention:
            answer["attention"] = [attention_view(t) for t in translations]
        if job.warnings:
            answer["warnings"] = job.warnings
        return answer

    def encode_response(self, output: dict | Rejected) -> Response:
        if isinstance(output, Rejected):
            return JSONResponse({"error": output.message}, status_code=output.status)
        return JSONResponse(output)


def model_info(name: str, path: str, engine: str, ensemble: list[str] = ()) -> dict:
    """What /info says about a served model, read from its configs without loading weights.
    An ensemble's family is "ensemble" and its attention null (its runs may differ in both:
    the first run's alone would misname it); ``members`` gives each run's, the first one
    included, and the parameters are all runs' together."""
    members = [run_summary(name, path),
               *(run_summary(model_name(member), member) for member in ensemble)]
    info = {**members[0], "parameters": sum(map(parameter_count, [path, *ensemble])),
            "engine": engine}
    if ensemble:
        info.update(family="ensemble", attention=None, members=members)
    return info


def run_summary(name: str, path: str) -> dict:
    """A run's name, family, attention and languages, from its config.yaml."""
    config = load_config(Path(path) / "config.yaml")
    return {"name": name, "family": config.model["family"], "attention": scorer_of(config.model),
            "src_lang": config.data.src_lang, "tgt_lang": config.data.tgt_lang}


def parameter_count(run_dir: str) -> int:
    """The parameters of a run's model, counted from its config and vocabulary."""
    config = load_config(Path(run_dir) / "config.yaml")
    with torch.device("meta"):  # shapes only: counting parameters allocates nothing
        model = build_model(config.model, len(Tokenizer(Path(run_dir) / "spm.model")))
    return sum(p.numel() for p in model.parameters())


def model_name(path: str | Path) -> str:
    """The name a served directory goes by: its own as given, "." and ".." read as the folders
    they name. A link keeps its name, not its target's: clients that ask for the model
    "current" (a link to the latest run) got a 400 unknown model once it pointed elsewhere."""
    return Path(os.path.abspath(path)).name


def served_models(paths: list[str], engine: str) -> dict[str, str]:
    """Model name (the directory's name) -> path; each checked before any worker starts."""
    runs: dict[str, str] = {}
    for path in paths:
        name = model_name(path)
        if name in runs:
            raise NMTError(f"two directories named '{name}': model names must differ")
        refuse_checkpoint_file(path)  # RUN/best.ckpt: the run and --weights, as translate says
        if not (Path(path) / "config.yaml").is_file() or not (Path(path) / "spm.model").is_file():
            what = "an exported model" if engine == "ctranslate2" else "a training run"
            raise NMTError(f"{path} is not {what} directory (no config.yaml and spm.model)")
        if engine == "ctranslate2" and not is_export(path):
            raise NMTError(f"no CTranslate2 model in {path}: serve a folder written by nmt export "
                           "(of a Transformer run), or serve the run with --engine torch")
        runs[name] = path
    return runs


async def bad_body(request: Request, error: RequestValidationError) -> JSONResponse:
    """FastAPI's answer to a body that is not a JSON object, in our one-line form."""
    first = error.errors()[0]
    if first["type"] == "json_invalid":
        message = "the body is not valid JSON"
    elif first["type"] == "value_error":  # ours: shallow's
        message = str(first["ctx"]["error"])
    elif first["type"] == "missing":
        message = 'the body is empty; send a JSON object like {"text": ["..."]}'
    elif isinstance(first.get("input"), bytes):  # FastAPI parses JSON only when told it is JSON
        message = "send the body as JSON, with the header Content-Type: application/json"
    else:
        message = 'the body must be a JSON object like {"text": ["..."]}'
    return JSONResponse({"error": message}, status_code=400)


async def http_error(request: Request, error: HTTPException) -> JSONResponse:
    """Every other HTTP error (unreadable body, timeout, ...) in the same {"error": ...} form.
    A body that is not UTF-8 is said so, where FastAPI says only "There was an error parsing
    the body": it parses the JSON (LitServe hands ``decode_request`` the parsed body, in its
    worker, or with a ``Request`` parameter parses it itself), and keeps why as the cause."""
    message = str(error.detail)
    if isinstance(cause := error.__cause__, UnicodeDecodeError):
        where = f" (byte {cause.start})" if cause.encoding == "utf-8" else ""  # from 0, as a file's
        message = f"the body is not valid UTF-8{where}: send the JSON encoded as UTF-8"
    return JSONResponse({"error": message}, status_code=error.status_code,
                        headers=getattr(error, "headers", None))


def static_page(content: str, media_type: str):
    """A GET endpoint that answers with fixed content (FastAPI reads no parameters from it)."""
    async def page() -> Response:
        return Response(content, media_type=media_type)
    return page


def add_page(app) -> None:
    """Serve nmt/web/ at / and /app.js, replacing LitServe's "litserve running" at /."""
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != "/"]
    web = resources.files("nmt") / "web"
    for route, (filename, media_type) in PAGE_FILES.items():
        content = (web / filename).read_text(encoding="utf-8")
        app.add_api_route(route, static_page(content, media_type), methods=["GET"],
                          include_in_schema=False)


def build_server(paths: list[str], engine: str = "torch", beam: int = 5,
                 max_batch: int = 32, timeout: float = 120.0, weights: str | None = None,
                 precision: str | None = None, ensemble: list[str] = ()) -> litserve.LitServer:
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
            from nmt.export import check_export
        except ImportError:
            raise NMTError('the ctranslate2 engine needs CTranslate2: pip install -e ".[export]"'
                           ) from None
        for path in runs.values():
            check_export(path)
    for path in runs.values():  # what the worker's warm-up would refuse: one line now
        check_decoding_config(load_config(Path(path) / "config.yaml"), engine, beam, precision)
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


def check_decoding_config(config, engine: str, beam: int, precision: str | None) -> None:
    """A served model's decoding options (its config's, a hand-edited one's too) as
    ``Translator.translate`` and ``decoding_precision`` check them in the worker, where a
    refusal was a traceback in the log and then "the server could not start" without why."""
    decoding_options(config.decoding, beam, 1, None)
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
          precision: str | None = None, ensemble: list[str] = (), timeout: float = 120.0) -> None:
    """Serve until Ctrl-C or SIGTERM, which stop LitServe's worker processes too and end the
    command as a finished one, whether the models were still loading or served: LitServe
    ends so once it serves, and a supervisor's stop (systemd, Kubernetes) is a clean end."""
    if host not in HOSTS:
        raise NMTError(f"--host must be one of {', '.join(HOSTS)} (LitServe binds only these)")
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
