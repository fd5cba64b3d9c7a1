"""A request's body checked field by field: a ``Job`` to translate, or a ``Rejected`` with
its one-line error; FastAPI's own errors about a body in the same {"error": ...} form."""

import json
import sys
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AfterValidator
from starlette.exceptions import HTTPException

from nmt.errors import echoed

FIELDS = ("text", "beam", "attention", "alignment", "model", "nbest", "attention_layer",
          "attention_head")
MAX_TEXTS = 64  # texts per request: more would hold up everyone batched with it
MAX_PIECES = 4096  # source pieces per request (after truncation), for the same reason
MAX_BEAM = 16
MAX_DEPTH = 8  # how deep a body's arrays and objects may nest; {"text": ["..."]} needs 2
TOO_DEEP = f'the body nests deeper than {MAX_DEPTH} levels; send a JSON object like {{"text": ["..."]}}'


def shallow(body: dict) -> dict:
    """``body`` if its arrays and objects nest at most ``MAX_DEPTH`` deep. FastAPI checks it in
    the HTTP process (``RequestBody``), before LitServe pickles the body for its worker, where
    a few hundred levels overflowed pickle's recursion: a 500, and a traceback in the log."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(TOO_DEEP)
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
    nbest: int = 1  # translations per text, best first
    alignment: bool = False  # the best translation's word pairs, as translate --alignment's
    attention_layer: int = -1  # the map both read, as translate's --attention-layer
    attention_head: str = "mean"  # and --attention-head: "mean" or a head number
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
    nbest, alignment = optional(body, "nbest", 1), optional(body, "alignment", False)
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
    whole_nbest = integral(nbest)
    if type(whole_nbest) is not int or not 1 <= whole_nbest <= whole_beam:
        return Rejected(f"'nbest' must be an integer from 1 to the beam ({whole_beam}), got "
                        f"{quoted(nbest)}")
    for name, flag in (("attention", attention), ("alignment", alignment)):
        if not isinstance(flag, bool):
            return Rejected(f"'{name}' must be true or false, got {quoted(flag)}")
    if model not in models:
        served = ", ".join(quoted(name, limit=None) for name in models)  # names to copy, whole
        return Rejected(f"unknown model {quoted(model)}; served: {served}")
    choice = attention_choice(body)
    if isinstance(choice, Rejected):
        return choice
    return Job(texts, whole_beam, attention, model, whole_nbest, alignment, *choice)


def attention_choice(body: dict) -> tuple[int, str] | Rejected:
    """The cross-attention map that "attention" and "alignment" read: "attention_layer" (an
    integer from 0, or from -1 back: -1, the default, is the last) and "attention_head" ("mean",
    the default, or a head number from 0), as translate's --attention-layer and
    --attention-head take them. Whether the model has that layer and head is checked against
    it (``TranslationAPI.decode_request``)."""
    layer = integral(optional(body, "attention_layer", -1))
    head = integral(optional(body, "attention_head", "mean"))
    if type(layer) is not int:  # bool is an int: excluded
        return Rejected("'attention_layer' must be an integer (-1: the last layer), got "
                        f"{quoted(body['attention_layer'])}")
    if head != "mean" and not (type(head) is int and head >= 0):
        return Rejected("'attention_head' must be \"mean\" or a head number from 0, got "
                        f"{quoted(body['attention_head'])}")
    return layer, str(head)


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


def quoted(value: Any, limit: int | None = 60) -> str:
    """``value`` as JSON writes it, a lone surrogate escaped too, and shortened to ``limit``
    characters (``echoed``; None: whole): a client's key or model name in an error can break
    neither the answer's UTF-8 (a 500 for every request batched with it) nor its one line."""
    text = json.dumps(value, ensure_ascii=False).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if limit is None else echoed(text, limit)


def _is_unicode(text: str) -> bool:
    """False for JSON's lone surrogates ("\\ud800"), which SentencePiece cannot take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    FastAPI parses the JSON (LitServe hands ``decode_request`` the parsed body, in its worker,
    or with a ``Request`` parameter parses it itself); where that fails other than as invalid
    JSON it says only "There was an error parsing the body" and keeps why as the cause. We say
    why: a body that is not UTF-8, one nesting too deep for Python's JSON parser (about 1,000
    levels: a RecursionError, before ``shallow`` could count them), or an integer of more
    digits than Python converts (4,300 by default)."""
    message = str(error.detail)
    if isinstance(cause := error.__cause__, UnicodeDecodeError):
        where = f" (byte {cause.start})" if cause.encoding == "utf-8" else ""  # from 0, as a file's
        message = f"the body is not valid UTF-8{where}: send the JSON encoded as UTF-8"
    elif isinstance(cause, RecursionError):
        message = TOO_DEEP
    elif type(cause) is ValueError:  # json's only other error: an integer past Python's limit
        message = f"a number in the body has more than {sys.get_int_max_str_digits():,} digits"
    return JSONResponse({"error": message}, status_code=error.status_code,
                        headers=getattr(error, "headers", None))
