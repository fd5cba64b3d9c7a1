"""nmt serve: a real server (``nmt serve`` in a subprocess on a free localhost port) with two
tiny runs. Translations come back in order and equal ``Translator``'s; bad requests get a
one-line 400 and leave the server running; concurrent requests, batched together, each get
their own answer; the web page translates and draws the heatmap in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import torch

from nmt.attention_stats import attention_matrix
from nmt.cli import main
from nmt.translator import Translation, Translator, find_checkpoint

from .conftest import child_processes, tiny_train_args, write_corpus

START_SECONDS = 240  # a busy 2-core machine needs a while to start LitServe's worker
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs (different seeds, so different translations) and the test sentences."""
    folder = tmp_path_factory.mktemp("serve")
    files = write_corpus(folder)
    paths = [folder / "first", folder / "second"]
    for path, seed in zip(paths, ("3", "4")):
        assert main(tiny_train_args(files, path, folder / "data") + ["--seed", seed]) == 0
    sentences = Path(files["test"][0]).read_text(encoding="utf-8").splitlines()
    translators = {path.name: Translator.from_run_dir(path, "cpu", precision="32-true")
                   for path in paths}
    return translators, paths, sentences


def free_port() -> int:
    """A port nothing listens on now (the default, 8000, may be taken on a shared machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_a_free_port(serve_once):
    """``serve_once(port)`` -> (its result, its output), tried on up to three ports found
    free: one may be taken before nmt serve checks it (by a test of another xdist worker),
    and nmt serve then says so and exits. Returns the first try's whose port was free."""
    for _ in range(3):
        result, output = serve_once(free_port())
        if "Address already in use" not in output:
            return result, output
    pytest.fail(f"nmt serve found no free port in three tries: {output[-2000:]}")


def serve_on_a_free_port(capsys, argv: list[str]) -> tuple[int, str]:
    """``nmt serve --port P ARGV`` in this process on a free port P (``on_a_free_port``): its
    exit status and what it wrote to stderr. Its port is checked first, whatever it refuses."""
    def serve_once(port: int) -> tuple[int, str]:
        code = main(["serve", "--port", str(port), *argv])
        return code, capsys.readouterr().err

    return on_a_free_port(serve_once)


def request(url: str, body: bytes | dict | None = None, headers: dict | None = None):
    """(status, decoded JSON or text) of a GET, or of a POST when there is a body."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, headers=JSON if headers is None else headers,
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def start_server(args: list[str], log: Path):
    """``nmt serve`` in its own process group; returns (process, base URL) once healthy. A
    port found free may be taken before the server listens on it (by a test of another
    xdist worker): the server then says so and exits, and starts again on another."""
    for _ in range(3):
        process, url = start_server_on(free_port(), args, log)
        if process is not None:
            return process, url
    pytest.fail(f"nmt serve found no free port in three tries: {log.read_text()[-2000:]}")


def start_server_on(port: int, args: list[str], log: Path):
    """(process, base URL) of ``nmt serve`` on ``port`` once healthy; (None, None) where
    that port was taken."""
    process = subprocess.Popen(
        [sys.executable, "-m", "nmt", "serve", *args, "--port", str(port)],
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        # Ctrl-C as in a terminal, also where pytest was started in the background (`&` in a
        # script), whose children inherit SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            # nmt serve's check of the port, or uvicorn's bind after it: both say so
            if "Address already in use" in log.read_text():
                return None, None
            pytest.fail(f"nmt serve exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if request(url + "/health")[0] == 200:
                return process, url
        except OSError:
            pass  # not listening yet
        time.sleep(0.2)
    stop_server(process)
    pytest.fail(f"nmt serve not healthy after {START_SECONDS} s: {log.read_text()[-2000:]}")


def stop_server(process) -> None:
    """SIGTERM: LitServe stops its workers; if it hangs, kill the group we started."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def server(runs, tmp_path_factory):
    _, paths, _ = runs
    log = tmp_path_factory.mktemp("log") / "serve.log"
    process, url = start_server(["--checkpoint", *map(str, paths), "--beam", "2",
                                 "--precision", "32-true", "--weights", "best.ckpt"], log)
    yield url
    stop_server(process)
    assert process.returncode == 0, log.read_text()[-2000:]


def expected(translator: Translator, texts: list[str], beam: int) -> list[str]:
    return [hyps[0].text for hyps in translator.translate(texts, beam)]


def test_health_and_info(server, runs):
    translators, _, _ = runs
    assert request(server + "/health") == (200, "ok")
    status, info = request(server + "/info")
    assert status == 200 and info["model"]["default_beam"] == 2
    models = info["model"]["models"]
    assert [m["name"] for m in models] == ["first", "second"]
    for m in models:
        assert (m["family"], m["attention"], m["src_lang"], m["tgt_lang"], m["engine"]) == \
            ("transformer", "scaled_dot", "de", "en", "torch")
        assert (m["attention_layers"], m["attention_heads"]) == (1, 2)  # model.heads=2, one layer
        assert m["parameters"] == sum(p.numel() for p in translators[m["name"]].model.parameters())


def test_translations_in_order_from_the_chosen_model(server, runs):
    translators, _, sentences = runs
    texts = sentences[:10] + [""]
    answers = {}
    for name, beam in (("first", 1), ("second", 3)):
        status, answer = request(server + "/translate", {"text": texts, "beam": beam, "model": name})
        assert status == 200 and answer["model"] == name and "warnings" not in answer
        assert answer["translations"] == expected(translators[name], texts, beam)
        answers[name] = answer["translations"]
    assert answers["first"][-1] == "" and answers["first"] != answers["second"]
    status, answer = request(server + "/translate", {"text": texts[:2]})  # defaults: first, beam 2
    assert answer["model"] == "first"
    assert answer["translations"] == expected(translators["first"], texts[:2], 2)


def test_a_text_with_a_line_break_is_one_sentence(server, runs):
    """As docs/usage.md says: a text is one sentence, its line breaks read as spaces (not translated
    line by line, nor refused)."""
    translators, _, sentences = runs
    joined = f"{sentences[0]}\n{sentences[1]}"
    status, answer = request(server + "/translate", {"text": [joined], "beam": 1})
    assert status == 200
    assert answer["translations"] == expected(translators["first"], [f"{sentences[0]} {sentences[1]}"], 1)


def test_attention_matrix_with_pieces(server, runs):
    translators, _, sentences = runs
    status, answer = request(server + "/translate", {"text": [sentences[0], ""], "attention": True})
    assert status == 200 and answer["attention"][1] is None  # nothing to attend for an empty text
    view = answer["attention"][0]
    tokenizer = translators["first"].tokenizer
    assert view["source"] == tokenizer.pieces(tokenizer.encode([sentences[0]])[0]) + ["</s>"]
    assert view["target"][-1] == "</s>" and len(view["weights"]) == len(view["target"])
    for row in view["weights"]:
        assert len(row) == len(view["source"]) and sum(row) == pytest.approx(1.0, abs=1e-2)


def test_alignments_are_what_translate_alignment_writes(server, runs, tmp_path, capsys):
    """"alignment": true answers each text's word pairs, in order, "" for an empty text: the
    pairs nmt translate --alignment writes after " ||| " for the same run, texts and beam; with
    "nbest" too, the best translation's (translate refuses --nbest there: its rows are Moses')."""
    _, paths, sentences = runs
    texts = sentences[:5] + [""]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(paths[1]), "--input", str(source), "--beam", "2",
                 "--precision", "32-true", "--weights", "best.ckpt", "--alignment"]) == 0
    rows = [row.split(" ||| ") for row in capsys.readouterr().out.splitlines()]
    for extra in ({}, {"nbest": 2}):
        status, answer = request(server + "/translate", {"text": texts, "beam": 2, "model": "second",
                                                         "alignment": True, **extra})
        assert status == 200 and "attention" not in answer
        assert [[t, a] for t, a in zip(answer["translations"], answer["alignments"])] == rows
    assert rows[-1] == ["", ""] and any(pairs for _, pairs in rows[:-1])


def test_attention_and_alignments_read_the_layer_and_head_asked_for(server, runs, tmp_path, capsys):
    """"attention_layer" and "attention_head" pick the map that "attention" and "alignment"
    read, as translate's --attention-layer and --attention-head do: the weights are that head's
    of the translation's attention, the pairs those translate writes with the same choice."""
    translators, paths, sentences = runs
    texts = sentences[:6]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    own = translators["second"].translate(texts, 2, need_attn=True)
    views = {}
    for head in (0, 1):
        assert main(["translate", "--checkpoint", str(paths[1]), "--input", str(source), "--beam", "2",
                     "--precision", "32-true", "--weights", "best.ckpt", "--alignment",
                     "--attention-layer", "0", "--attention-head", str(head)]) == 0
        rows = [row.split(" ||| ") for row in capsys.readouterr().out.splitlines()]
        status, answer = request(server + "/translate", {
            "text": texts, "beam": 2, "model": "second", "attention": True, "alignment": True,
            "attention_layer": 0, "attention_head": head})
        assert status == 200
        assert [[t, a] for t, a in zip(answer["translations"], answer["alignments"])] == rows
        for view, hyps in zip(answer["attention"], own):
            expected_rows = attention_matrix(hyps[0].attention, 0, head).tolist()
            assert [row == pytest.approx(want, abs=1e-4) for row, want in
                    zip(view["weights"], expected_rows)] == [True] * len(expected_rows)
        views[head] = answer["attention"]
    assert views[0] != views[1]  # the heads look at different pieces: the choice is read


@pytest.mark.parametrize("body,message", [
    ({"beam": 2}, "missing field 'text'"),
    ({"text": None}, "'text' must be a list of strings"),
    ({"text": "ein hund"}, "'text' must be a list of strings"),
    ({"text": ["ein", 3]}, "'text' must be a list of strings"),
    ({"text": []}, "'text' must hold 1 to 64 strings, got 0"),
    ({"text": ["x"] * 65}, "'text' must hold 1 to 64 strings, got 65"),
    ({"text": ["x"], "beam": True}, "'beam' must be an integer from 1 to 16, got true"),
    ({"text": ["x"], "beam": "5"}, "'beam' must be an integer"),
    ({"text": ["x"], "beam": 0}, "'beam' must be an integer"),
    ({"text": ["x"], "beam": 2.5}, "'beam' must be an integer from 1 to 16, got 2.5"),
    ({"text": ["x"], "beam": 0.0}, "'beam' must be an integer from 1 to 16, got 0.0"),
    ({"text": ["x"], "attention": 1}, "'attention' must be true or false"),
    ({"text": ["x"], "alignment": "yes"}, "'alignment' must be true or false, got \"yes\""),
    ({"text": ["x"], "attention_layer": "last"},
     "'attention_layer' must be an integer (-1: the last layer), got \"last\""),
    ({"text": ["x"], "attention_layer": 0.5}, "'attention_layer' must be an integer"),
    ({"text": ["x"], "attention_layer": True}, "'attention_layer' must be an integer"),
    ({"text": ["x"], "attention_head": "all"},
     "'attention_head' must be \"mean\" or a head number from 0, got \"all\""),
    ({"text": ["x"], "attention_head": -1}, "'attention_head' must be \"mean\" or a head number"),
    ({"text": ["x"], "attention_head": "1"}, "'attention_head' must be \"mean\" or a head number"),
    # what the served model lacks: one decoder layer, two heads
    ({"text": ["x"], "attention_layer": 1, "attention": True},
     "no attention layer 1 / head mean in this model: it has 1 layer and 2 heads, counted from 0"),
    ({"text": ["x"], "attention_layer": -2}, "no attention layer -2 / head mean in this model"),
    ({"text": ["x"], "attention_head": 2, "alignment": True}, "no attention layer -1 / head 2 in"),
    # what a client sent is repeated shortened: 1e300 is an integer of 301 digits
    ({"text": ["x"], "attention_layer": 1e300},
     f"no attention layer {str(int(1e300))[:57]}... / head mean in this model"),
    ({"text": ["x"], "beam": "5" * 10_000}, f'got "{"5" * 56}...'),  # 60 characters
    ({"text": ["x"], "model": "third"}, 'unknown model "third"; served: "first", "second"'),
    ({"text": ["x"], "model": "modèle"}, 'unknown model "modèle"'),  # as sent, not \\u00e8
    ({"text": ["x"], "txet": 1}, 'unknown field "txet"'),
    (b'{"text": ["x"], "\\udc80": 1}', 'unknown field "\\udc80"'),  # a lone surrogate: a 500 before
    (b'{"text": ["x"], "a\\nb": 1}', 'unknown field "a\\nb"'),  # one line
    (b'{"text": ["x"], "model": "\\ud800"}', 'unknown model "\\ud800"'),
    (b"[1, 2]", "the body must be a JSON object"),
    (b'{"text": [', "not valid JSON"),
    (b"", "the body is empty"),
    # not UTF-8: FastAPI's "There was an error parsing the body" before
    (b'{"text": ["\xff\xfe"]}', "the body is not valid UTF-8 (byte 11): send the JSON encoded as UTF-8"),
    (b'{"text": ["ok", "\\ud800"]}', "text 2 is not valid Unicode"),  # a lone surrogate
    (b'{"text": ["x"], "beam": ' + b"[" * 8 + b"]" * 8 + b"}", "nests deeper than 8 levels"),
    # deeper than pickle could take on its way to the worker: a 500 before
    (b'{"text": ["x"], "beam": ' + b"[" * 600 + b"]" * 600 + b"}", "nests deeper than 8 levels"),
    # deeper than Python's JSON parser takes: "There was an error parsing the body" before
    (b'{"text": ["x"], "beam": ' + b"[" * 3000 + b"]" * 3000 + b"}", "nests deeper than 8 levels"),
    # past Python's limit on an integer's digits: "There was an error parsing the body" before
    (b'{"text": ["x"], "beam": ' + b"5" * 5000 + b"}",
     f"a number in the body has more than {sys.get_int_max_str_digits():,} digits"),
])
def test_bad_request_gets_one_line_400(server, body, message):
    status, answer = request(server + "/translate", body)
    assert status == 400 and message in answer["error"] and "\n" not in answer["error"]
    assert len(answer["error"]) < 250


def test_null_means_the_default_as_an_omitted_field():
    """The page's beam box, cleared, sent "beam": null (JSON's NaN), as a form's empty box
    does: a 400 "'beam' must be an integer from 1 to 16, got null", "model": null likewise."""
    from nmt.serve.request import Job, parse_request

    models = ["first", "second"]
    nulls = {"text": ["x"], "beam": None, "attention": None, "model": None,
             "attention_layer": None, "attention_head": None}
    assert parse_request(nulls, models, 2) == parse_request({"text": ["x"]}, models, 2) \
        == Job(["x"], 2, False, "first")


def test_an_answer_reads_the_layer_and_head_its_request_picks(runs):
    """The map that "attention" draws and "alignment" reads is the one the request picks, from
    a Transformer's (T, layers, heads, S) attention: here two layers that attend in opposite
    orders, so that reading the wrong one gives other weights and other word pairs."""
    from nmt.serve.api import TranslationAPI
    from nmt.serve.request import Job

    translators, paths, _ = runs
    api = TranslationAPI({"first": str(paths[0])}, "torch", default_beam=1, max_batch=4)
    api.translators = {"first": translators["first"]}  # what setup loads: its tokenizer numbers words
    diagonal = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]], dtype=torch.float64)
    crossed = diagonal[:, [1, 0, 2]]  # "a" to "hund", "dog" to "ein"
    attention = torch.stack([diagonal, crossed], dim=1)  # (T, layers, S)
    attention = torch.stack([attention, attention], dim=2)  # (T, layers, heads, S)
    best = Translation("a dog", -1.0, ["\u2581a", "\u2581dog"], attention,
                       ["\u2581ein", "\u2581hund", "</s>"])
    answers = {layer: api._answer(Job(["ein hund"], 1, True, "first", alignment=True,
                                      attention_layer=layer), [[best]])
               for layer in (0, 1, -1)}
    assert answers[0]["attention"][0]["weights"] == diagonal.tolist()
    assert answers[0]["alignments"] == ["0-0 1-1"]
    assert answers[1]["attention"][0]["weights"] == crossed.tolist()
    assert answers[1]["alignments"] == ["1-0 0-1"]
    assert answers[-1] == answers[1]  # -1 is the last layer


def test_a_whole_number_sent_as_a_float_is_an_integer():
    """JSON clients often send every number as a float (JavaScript has no other): "beam": 2.0
    got a 400 "'beam' must be an integer"; it is beam 2 now, where 2.5 is still refused."""
    from nmt.serve.request import Job, Rejected, parse_request

    models = ["first"]
    assert parse_request({"text": ["x"], "beam": 2.0}, models, 5) == Job(["x"], 2, False, "first")
    assert parse_request({"text": ["x"], "beam": 1e300}, models, 5) == \
        Rejected("'beam' must be an integer from 1 to 16, got 1e+300")
    assert parse_request({"text": ["x"], "attention_layer": -1.0, "attention_head": 1.0}, models, 5) \
        == Job(["x"], 5, False, "first", attention_layer=-1, attention_head="1")


def test_nbest_is_checked_against_the_beam():
    from nmt.serve.request import Job, Rejected, parse_request

    models = ["first"]
    assert parse_request({"text": ["x"], "beam": 3, "nbest": 2.0}, models, 5) == \
        Job(["x"], 3, False, "first", 2)
    assert parse_request({"text": ["x"], "nbest": None}, models, 5).nbest == 1
    for nbest in (4, 0, True, "2"):
        assert parse_request({"text": ["x"], "beam": 3, "nbest": nbest}, models, 5) == \
            Rejected(f"'nbest' must be an integer from 1 to the beam (3), got {json.dumps(nbest)}")


def test_nbest_lists_are_answered_as_translate_gives_them(server, runs):
    """The API had no n-best lists, which translate --nbest gives: a request may ask for
    its texts' best K (K <= its beam), with their scores, beside requests that do not."""
    translators, _, sentences = runs
    status, answer = request(server + "/translate", {"text": sentences[:3], "beam": 3, "nbest": 3})
    want = translators["first"].translate(sentences[:3], 3, nbest=3)
    assert status == 200 and answer["translations"] == [hyps[0].text for hyps in want]
    assert answer["nbest"] == [[{"text": t.text, "score": round(t.score, 4)} for t in hyps]
                               for hyps in want]
    assert all(len(hyps) == 3 for hyps in answer["nbest"])
    status, answer = request(server + "/translate", {"text": sentences[:3], "beam": 3})
    assert status == 200 and "nbest" not in answer


def test_body_without_json_content_type(server):
    status, answer = request(server + "/translate", b'{"text": ["x"]}', headers={})
    assert status == 400 and "Content-Type: application/json" in answer["error"]


def test_too_long_text_is_truncated_with_warning(server):
    status, answer = request(server + "/translate", {"text": ["hund", "haus " * 600], "beam": 1})
    assert status == 200 and len(answer["translations"]) == 2
    assert answer["warnings"] == ["text 2 has 600 pieces; truncated to 511"]


def test_a_truncated_text_is_reported_in_its_answer_not_in_the_log(runs, capsys):
    """The answer names the texts cut to the model's length; the server's stderr does not (any
    client could flood it, and its line numbers would count a batch's texts, not a request's)."""
    from nmt.serve.api import TranslationAPI

    translators, paths, _ = runs
    api = TranslationAPI({"first": str(paths[0])}, "torch", default_beam=1, max_batch=4)
    api.translators = translators
    job = api.decode_request({"text": ["hund", "haus " * 600]})
    answer = api._translate_group([job])[0]
    assert answer["warnings"] == ["text 2 has 600 pieces; truncated to 511"]
    assert "truncated" not in capsys.readouterr().err


def test_a_beam_over_the_vocabulary_is_a_400_not_a_failed_translation(runs, monkeypatch):
    """translate refuses a beam larger than the vocabulary (a toy's, here 4 pieces): a request
    asking for one was a 500 "translation failed" from the worker; now its 400 says why."""
    from nmt.data.tokenizer import Tokenizer
    from nmt.serve.api import TranslationAPI
    from nmt.serve.request import Job, Rejected

    translators, paths, _ = runs
    api = TranslationAPI({"first": str(paths[0])}, "torch", default_beam=1, max_batch=4)
    api.translators = translators
    monkeypatch.setattr(Tokenizer, "__len__", lambda self: 4)
    assert api.decode_request({"text": ["hund"], "beam": 5}) == \
        Rejected("'beam' must be at most the vocabulary's 4 pieces for model \"first\", got 5")
    assert isinstance(api.decode_request({"text": ["hund"], "beam": 4}), Job)


def test_a_default_beam_over_the_vocabulary_is_one_line_before_start(runs, capsys, monkeypatch):
    """--beam above a served model's vocabulary: the worker's warm-up refused it, a traceback in
    the log and then "the server could not start"; now one line before any worker starts."""
    import litserve

    from nmt.data.tokenizer import Tokenizer

    class ToyVocabulary(Tokenizer):  # as the start-up check reads it (the weights' check not)
        def __len__(self) -> int:
            return 4

    _, paths, _ = runs
    monkeypatch.setattr("nmt.serve.server.Tokenizer", ToyVocabulary)
    monkeypatch.setattr(litserve.LitServer, "run", lambda self, **options: None)  # never starts
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", str(paths[0]), "--beam", "5"])
    assert code == 1
    assert "beam 5 is more than the vocabulary's 4 pieces" in err and err.count("\n") == 1, err


def test_a_request_of_too_many_pieces_is_refused_before_it_is_decoded(server):
    """Texts of more than 4,096 pieces in all (after each is cut to 511) would hold up every
    request batched with them: 413, one line, while a request within the limit is answered."""
    status, answer = request(server + "/translate", {"text": ["haus " * 600] * 9, "beam": 1})
    assert status == 413 and answer["error"] == (
        "the texts hold 4,599 pieces; at most 4,096 per request: send fewer or shorter texts")
    status, answer = request(server + "/translate", {"text": ["haus " * 600] * 8, "beam": 1})
    assert status == 200 and len(answer["translations"]) == 8


def test_concurrent_requests_each_get_their_own_answer(server, runs):
    """Requests arriving together are decoded in one batch; each answer is its own input's
    translation, and a bad request in the same batch fails alone."""
    translators, _, sentences = runs
    jobs = [{"text": sentences[i : i + 1 + i % 3], "beam": 1 + i % 2, "model": ("first", "second")[i % 2]}
            for i in range(24)]
    bad = {5: {"text": [], "model": "first"}, 17: {"text": ["x"], "model": "nobody"},
           11: {"text": ["x"], "model": "\ud800"}}  # its answer's error could not be encoded
    jobs = [bad.get(i, job) for i, job in enumerate(jobs)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: request(server + "/translate", job), jobs))
    for i, (job, (status, answer)) in enumerate(zip(jobs, answers)):
        if i in bad:
            assert status == 400 and "error" in answer
        else:
            assert status == 200, answer
            assert answer["translations"] == expected(translators[job["model"]], job["text"], job["beam"])
    assert request(server + "/health") == (200, "ok")


def test_a_server_of_batches_of_one_answers_each_request(runs, tmp_path):
    """--max-batch 1: LitServe then hands ``predict`` each request alone, not in a list (every
    request got a 500). A good request is translated, a bad one gets its 400."""
    translators, paths, sentences = runs
    process, url = start_server(["--checkpoint", str(paths[0]), "--max-batch", "1",
                                 "--precision", "32-true", "--weights", "best.ckpt"],
                                tmp_path / "serve.log")
    try:
        status, answer = request(url + "/translate", {"text": sentences[:3], "beam": 2})
        assert status == 200, answer
        assert answer["translations"] == expected(translators["first"], sentences[:3], 2)
        status, answer = request(url + "/translate", {"text": []})
        assert status == 400 and "error" in answer
    finally:
        stop_server(process)


def test_a_request_that_waits_past_the_timeout_gets_a_504(runs, tmp_path):
    """--timeout: requests queued behind others longer than it are answered 504 in our
    one-line JSON form, the others translated. The log says so, naming --timeout, not the
    argument of LitServe's Python API its own line advised."""
    translators, paths, sentences = runs
    log = tmp_path / "serve.log"
    process, url = start_server(["--checkpoint", str(paths[0]), "--max-batch", "1",
                                 "--timeout", "0.1", "--precision", "32-true",
                                 "--weights", "best.ckpt"], log)
    body = {"text": (sentences * 64)[:64], "beam": 8}  # the most a request may ask
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: request(url + "/translate", body), range(8)))
    finally:
        stop_server(process)
    statuses = sorted(status for status, _ in answers)
    assert statuses[0] == 200 and statuses[-1] == 504, statuses
    assert all(answer == {"error": "Request timed out"} for status, answer in answers if status == 504)
    timed_out = [line for line in log.read_text().splitlines() if "has been timed out" in line]
    assert len(timed_out) == statuses.count(504) and all(line.endswith(
        "(0.1 seconds) and has been timed out. Raise the limit with nmt serve --timeout SECONDS (0: none).")
        for line in timed_out), timed_out


def test_ctrl_c_stops_the_server_without_a_traceback(runs, tmp_path):
    """Ctrl-C in a terminal signals the whole process group: LitServe's inference worker too,
    which printed a KeyboardInterrupt traceback while the server shut down."""
    _, paths, _ = runs
    log = tmp_path / "serve.log"
    process, _ = start_server(["--checkpoint", str(paths[0]), "--precision", "32-true",
                               "--weights", "best.ckpt"], log)
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=60)
    finally:
        stop_server(process)
    assert process.returncode == 0, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text(), log.read_text()[-2000:]


def test_a_server_stopped_while_its_worker_loads_stops_the_worker(runs, monkeypatch, capsys):
    """SIGTERM (as Ctrl-C) while LitServe waits for its worker to load: LitServe stops its
    workers only once it serves, so the command's exit waited for the worker to load, and
    then printed its traceback. The worker is stopped at once instead, and the command ends
    as a server stopped while serving does."""
    import litserve

    _, paths, _ = runs
    workers = []

    def interrupted(server) -> None:  # the signal, as it comes while the worker loads
        workers.extend(server.inference_workers)
        raise KeyboardInterrupt

    monkeypatch.setattr(litserve.LitServer, "verify_worker_status", interrupted)
    try:
        assert serve_on_a_free_port(capsys, ["--checkpoint", str(paths[0]), "--precision",
                                             "32-true", "--weights", "best.ckpt"])[0] == 0
        for worker in workers:
            worker.join(timeout=60)
        assert workers and all(w.exitcode == -signal.SIGTERM for w in workers)
    finally:
        for worker in workers:
            worker.kill()


@pytest.mark.parametrize("owner, name", [("nmt.serve.server", "check_run_weights"),  # before a worker
                                         ("litserve:LitServer", "verify_worker_status")])  # loading
def test_sigterm_before_the_server_serves_ends_it_as_once_it_serves(runs, owner, name):
    """SIGTERM, a supervisor's stop (systemctl stop, a Kubernetes pod deleted), ends a server
    that serves with status 0, which systemd reads as a clean stop; before it served, it was
    killed by the signal while its models were checked, and exited 130 ("interrupted", as if
    Ctrl-C) while its worker loaded. Now 0 throughout."""
    _, paths, _ = runs

    def serve_once(port: int) -> tuple[subprocess.CompletedProcess, str]:
        code = f"""if True:
            import os, pkgutil, signal, sys
            from nmt.cli import main

            def stopped(*args, **kwargs):  # the signal, as it comes while this runs
                os.kill(os.getpid(), signal.SIGTERM)

            setattr(pkgutil.resolve_name({owner!r}), {name!r}, stopped)
            sys.exit(main(["serve", "--checkpoint", {str(paths[0])!r}, "--port", "{port}",
                           "--precision", "32-true", "--weights", "best.ckpt"]))"""
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300)
        return done, done.stderr

    process = on_a_free_port(serve_once)[0]
    assert process.returncode == 0 and "Traceback" not in process.stderr, process.stderr[-2000:]


def test_sigterm_while_the_server_imports_ends_it_as_once_it_serves(runs):
    """SIGTERM while nmt serve imported torch and LitServe (seconds, before its models were
    checked) killed it (143 in a shell; a failure to systemd), where later it exits 0. The
    stop comes before nmt serve checks its port, so any port does."""
    _, paths, _ = runs
    code = f"""if True:
        import builtins, os, signal, sys
        from nmt.cli import main

        load = builtins.__import__

        def stopped(name, *args, **kwargs):  # the signal, as it comes while the server imports
            if name == "nmt.serve":
                os.kill(os.getpid(), signal.SIGTERM)
            return load(name, *args, **kwargs)

        builtins.__import__ = stopped
        sys.exit(main(["serve", "--checkpoint", {str(paths[0])!r}, "--port", "{free_port()}"]))"""
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300)
    assert process.returncode == 0 and "Traceback" not in process.stderr, process.stderr[-2000:]


def inference_workers(process) -> list[int]:
    """The pids of server ``process``'s LitServe inference workers: in its process group,
    spawned (multiprocessing's spawn_main runs them), read from Linux's /proc."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with suppress(OSError):  # a process that ended meanwhile
            pid = int(cmdline.parent.name)
            if b"spawn_main" in cmdline.read_bytes() and os.getpgid(pid) == process.pid:
                pids.append(pid)
    return pids


@pytest.mark.parametrize("exitcodes, death", [
    ([None], None),  # running
    ([0], None),
    ([-signal.SIGTERM], None),  # LitServe's own, at a shut-down for another reason
    ([-signal.SIGTERM, -signal.SIGKILL], "killed by SIGKILL: out of memory?"),
    ([1], "exit status 1"),
])
def test_a_worker_stopped_by_litserve_is_not_called_dead(exitcodes, death):
    """Any error at LitServe's queues was blamed on a dead worker once a worker had a non-zero
    exit code, also the SIGTERM LitServe sends its workers as it shuts down for another cause."""
    from types import SimpleNamespace

    from nmt.serve.processes import worker_death

    server = SimpleNamespace(inference_workers=[SimpleNamespace(exitcode=code) for code in exitcodes])
    assert worker_death(server) == death


def test_a_server_whose_worker_dies_stops_in_one_line(runs, tmp_path):
    """The inference worker killed (the OOM killer's SIGKILL): LitServe stops the server, whose
    status must say so to a supervisor (not 0), in one line (it was a traceback, EOFError)."""
    _, paths, _ = runs
    log = tmp_path / "serve.log"
    process, _ = start_server(["--checkpoint", str(paths[0]), "--precision", "32-true",
                               "--weights", "best.ckpt"], log)
    try:
        workers = inference_workers(process)
        assert len(workers) == 1
        os.kill(workers[0], signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        stop_server(process)
    text = log.read_text()
    assert process.returncode == 1 and "Traceback" not in text, text[-2000:]
    assert text.splitlines()[-1] == ("error: the inference worker died (killed by SIGKILL: out of "
                                     "memory?), so the server stopped: start it again (in "
                                     "production, under a supervisor that restarts it)")


def litserve_forks(process) -> list[int]:
    """The pids of the processes LitServe forks from server ``process``, in the order they
    started: its manager (before the inference worker loads), then its HTTP server (Linux's
    /proc)."""
    def started(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])

    own = Path(f"/proc/{process.pid}/cmdline").read_bytes()
    forks = [pid for pid in child_processes(process.pid)
             if Path(f"/proc/{pid}/cmdline").read_bytes() == own]
    return sorted(forks, key=started)


def kill_litserve_process(runs, tmp_path, which: int, options: tuple[str, ...] = ()
                          ) -> tuple[int, str]:
    """Serve (with more ``options``), kill LitServe's manager (``which`` 0) or HTTP server (1)
    as the OOM killer would, and return the command's exit status and its output once it has
    ended."""
    _, paths, _ = runs
    log = tmp_path / "serve.log"
    process, _ = start_server(["--checkpoint", str(paths[0]), "--precision", "32-true",
                               "--weights", "best.ckpt", *options], log)
    try:
        time.sleep(0.5)  # serving for a while: the watch knows a process once seen running
        manager, http = litserve_forks(process)
        os.kill((manager, http)[which], signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        stop_server(process)
    return process.returncode, log.read_text()


def test_a_server_whose_http_process_dies_stops_in_one_line(runs, tmp_path):
    """LitServe's HTTP server process killed (the OOM killer's SIGKILL): LitServe watches its
    inference workers alone, and nmt serve ran on, serving nothing (every connection waited,
    unanswered). It now stops, in one line, with a status a supervisor acts on."""
    code, text = kill_litserve_process(runs, tmp_path, which=1)
    assert code == 1 and "Traceback" not in text, text[-2000:]
    assert text.splitlines()[-1] == ("error: the HTTP server process died (killed by SIGKILL: out "
                                     "of memory?), so the server stopped: start it again (in "
                                     "production, under a supervisor that restarts it)")


@pytest.mark.parametrize("options", [(), ("--max-batch", "1")])  # LitServe's two loops
def test_a_server_whose_manager_dies_says_so_in_one_line(runs, tmp_path, options):
    """LitServe's manager killed: the command's last word was the EOFError of its traceback
    at the queues the manager held. It is now a line that says which process died, and the
    inference worker, reading those queues too, ends quietly (it printed its own EOFError
    traceback above that line)."""
    code, text = kill_litserve_process(runs, tmp_path, which=0, options=options)
    assert code == 1 and "Traceback" not in text, text[-2000:]
    assert text.splitlines()[-1] == ("error: LitServe's manager process died (killed by SIGKILL: "
                                     "out of memory?), so the server stopped: start it again (in "
                                     "production, under a supervisor that restarts it)")


def test_page_and_script_are_served(server):
    status, page = request(server + "/")
    assert status == 200 and '<script src="/app.js">' in page
    status, script = request(server + "/app.js")
    assert status == 200 and "function drawHeatmap" in script


@contextmanager
def translated_page(server: str, text: str, also: Sequence[str] = ()):
    """The page in headless Chromium, ``text`` translated at beam 1 by the first model (ticked
    already) and the models named in ``also``."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(server + "/")
        page.wait_for_selector("#models input[value=first]")
        for name in also:
            page.check(f"#models input[value={name}]")
        page.fill("#source", text)
        page.fill("#beam", "1")
        page.click("#translate")
        try:
            yield page
        finally:
            browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
def test_web_page_translates_and_draws_heatmaps(server, runs, tmp_path):
    """Headless Chromium: pick both models, translate, see both translations, their word
    alignments (each target word beside its source word, as the server's pairs say) and
    heatmaps."""
    translators, _, sentences = runs
    with translated_page(server, sentences[0], also=["second"]) as page:
        page.wait_for_selector(".card[data-model=second] canvas[data-drawn]", timeout=60_000)
        for name in ("first", "second"):
            card = page.locator(f".card[data-model={name}]")
            want = expected(translators[name], sentences[:1], 1)[0]
            assert card.locator(".translation").inner_text() == want
            assert card.locator(".meta").inner_text().startswith("transformer, scaled_dot attention, ")
            _, answer = request(server + "/translate", {"text": sentences[:1], "beam": 1,
                                                        "alignment": True, "model": name})
            src, tgt = sentences[0].split(), want.split(" ")
            pairs = [p.split("-") for p in answer["alignments"][0].split()]
            if want:  # the first tiny run's; the second's translation is empty: no pairs shown
                assert len(pairs) == len(tgt)
                assert card.locator(".alignment span").all_inner_texts() == \
                    [f"{tgt[int(j)]} \u2190 {src[int(i)]}" for i, j in pairs]
            else:
                assert pairs == [] and card.locator(".alignment").count() == 0
            # Shaded cells: bluish pixels (neither the white background nor the grey text).
            blue = card.locator("canvas").evaluate(
                "c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
                " let n = 0; for (let i = 0; i < d.length; i += 4)"
                " if (d[i] < 250 && d[i + 2] > d[i]) n++; return n; }")
            assert blue > 100
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    assert (tmp_path / "page.png").stat().st_size > 0


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
def test_web_page_redraws_the_map_of_the_layer_and_head_picked(server, runs):
    """A Transformer's card has a layer menu (last, 0, ...) and a head menu (mean, 0, ...) from
    /info; picking head 1 redraws the card from the server's answer for that head: its word
    pairs, and a heatmap other than the mean's."""
    _, _, sentences = runs
    with translated_page(server, sentences[1]) as page:
        card = page.locator(".card[data-model=first][data-map='-1:mean']")
        card.locator("canvas[data-drawn]").wait_for(timeout=60_000)
        assert card.locator("select[name=layer] option").all_inner_texts() == ["last", "0"]
        assert card.locator("select[name=head] option").all_inner_texts() == ["mean", "0", "1"]
        mean_map = card.locator("canvas").evaluate("c => c.toDataURL()")
        card.locator("select[name=head]").select_option("1")
        card = page.locator(".card[data-model=first][data-map='-1:1']")  # the card drawn anew
        card.locator("canvas[data-drawn]").wait_for(timeout=60_000)
        _, answer = request(server + "/translate", {"text": sentences[1:2], "beam": 1,
                                                    "alignment": True, "attention_head": 1})
        src, tgt = sentences[1].split(), answer["translations"][0].split(" ")
        assert card.locator(".alignment span").all_inner_texts() == \
            [f"{tgt[int(j)]} \u2190 {src[int(i)]}" for i, j in (p.split("-") for p in
                                                            answer["alignments"][0].split())]
        assert card.locator("canvas").evaluate("c => c.toDataURL()") != mean_map
        assert card.locator("select[name=layer]").input_value() == "-1"
        # A pick that fails says why, once however often, and the menus show the map drawn again.
        page.evaluate("""() => { window.fetch = async () => new Response(
            JSON.stringify({error: "the server is down"}), {status: 500}); }""")
        drawn = card.locator("canvas").evaluate("c => c.toDataURL()")
        for head in ("0", "mean"):
            card.locator("select[name=head]").select_option(head)
            card.locator(".error").wait_for(timeout=60_000)
            page.wait_for_function("() => document.querySelector('.card[data-model=first] "
                                   "select[name=head]').value === '1'", timeout=60_000)
        assert card.locator(".error").all_inner_texts() == ["the server is down"]
        assert card.locator("canvas").evaluate("c => c.toDataURL()") == drawn


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
def test_web_page_shows_only_the_latest_answers_and_their_warnings(server, runs):
    """A click whose answers come late (held back here) no longer adds its cards beside those of
    the click after it; a text cut to the model's length says so on its card."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    translators, _, sentences = runs
    long_text = "Hund " * 600
    hold_back_long_texts = """() => { const fetchNow = window.fetch;
        window.fetch = (url, options) => options.body.includes("Hund Hund")
            ? new Promise((r) => setTimeout(r, 2000)).then(() => fetchNow(url, options))
            : fetchNow(url, options); }"""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(server + "/")
        page.wait_for_selector("#models input[value=first]")
        page.fill("#beam", "1")
        page.fill("#source", long_text)
        page.click("#translate")
        page.wait_for_selector(".card .warning", timeout=120_000)
        assert "truncated to" in page.locator(".card .warning").first.inner_text()
        page.evaluate(hold_back_long_texts)
        page.click("#translate")  # the long text again, answered 2 s late
        page.fill("#source", sentences[0])
        page.click("#translate")
        page.wait_for_selector(".card", timeout=60_000)
        page.wait_for_timeout(4000)  # the held-back answers arrive meanwhile
        translations = page.locator(".card .translation").all_inner_texts()
        assert translations == [expected(translators["first"], sentences[:1], 1)[0]]
        browser.close()


@pytest.mark.parametrize("argv,message", [
    (["--host", "example.org"], "--host must be one of"),
    (["--port", "80"], "--port must be from 1024 to 65535"),
    (["--engine", "onnx"], "unknown engine 'onnx'"),
    (["--engine", "ctranslate2"], "nmt export"),
    (["--beam", "0"], "--beam must be from 1 to 16"),
    (["--engine", "ctranslate2", "--precision", "32-true"], "--precision is for the torch engine"),
    (["--weights", "averaged.ckpt"], "weights file not found"),
    (["--timeout", "-1"], "--timeout must be 0 (no limit) or a number of seconds over 0.02"),
    (["--timeout", "0.01"], "--timeout must be 0"),
    (["--timeout", "nan"], "--timeout must be 0"),
])
def test_serve_bad_options_give_one_line_error(runs, capsys, argv, message):
    _, paths, _ = runs
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", str(paths[0]), *argv])
    assert code == 1
    assert message in err and err.count("\n") == 1


def test_serve_port_in_use(runs, capsys):
    _, paths, _ = runs
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--checkpoint", str(paths[0]), "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_serve_missing_run_directory(capsys, tmp_path):
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", str(tmp_path / "nothing")])
    assert code == 1 and "not a training run directory" in err


def test_serve_a_run_without_weights_is_one_line_before_start(runs, capsys, tmp_path):
    """A run directory with its config and SentencePiece model but no checkpoint: refused before
    any worker starts (it was a worker's traceback)."""
    _, paths, _ = runs
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.yaml", "spm.model"):
        (bare / name).write_bytes((paths[0] / name).read_bytes())
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", str(bare)])
    assert code == 1
    assert f"no best.ckpt or last.ckpt in {bare}" in err and err.count("\n") == 1


def test_a_server_probes_auto_at_its_default_beam(runs, tmp_path, monkeypatch):
    """auto's probe timed the run's decoding.beam_size (5), whatever --beam the server
    decodes requests at: now --beam's, for a batch of --max-batch requests."""
    from nmt import precision
    from nmt.serve.api import TranslationAPI

    _, paths, _ = runs
    monkeypatch.setattr(precision, "CACHE", tmp_path / "precision.json")
    monkeypatch.setattr(precision, "has_native_bf16", lambda: True)
    probes = []
    monkeypatch.setattr(precision, "time_decoding", lambda model, sentences, beam, **_: probes.append(
        (sentences, beam)) or {"fp32": 1.0, "bf16": 0.5, "steady": True})
    api = TranslationAPI({"first": str(paths[0])}, "torch", default_beam=2, max_batch=4,
                         precision="auto")
    api.setup("cpu")
    assert probes == [(4, 2)] and api.translators["first"].precision.precision == "bf16-mixed"


@pytest.mark.parametrize("weights, message", [
    (b"garbage", "incompatible or damaged checkpoint"),  # a file cut short or of something else
    (None, "incompatible or damaged checkpoint (Error(s) in loading state_dict"),  # another model's
])
def test_serve_weights_that_do_not_load_are_one_line_before_start(runs, capsys, tmp_path,
                                                                   weights, message):
    """They failed in the worker: its traceback, then "the server could not start" without why."""
    _, paths, _ = runs
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("config.yaml", "spm.model"):
        (bad / name).write_bytes((paths[0] / name).read_bytes())
    checkpoint = torch.load(find_checkpoint(paths[0]), weights_only=False)
    checkpoint["state_dict"] = {k: v[:1] for k, v in checkpoint["state_dict"].items()}
    if weights is None:
        torch.save(checkpoint, bad / "best.ckpt")
    else:
        (bad / "best.ckpt").write_bytes(weights)
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", str(bad)])
    assert code == 1
    assert f"cannot load {bad / 'best.ckpt'}: {message}" in err and err.count("\n") == 1, err


def test_serve_refuses_a_weights_path_for_several_runs(runs, capsys, monkeypatch):
    """Each run served the one file named (its folder part found it outside every run); a
    name inside each run (best.ckpt, steps/...) is each run's own file, ./best.ckpt the
    current folder's, as in a shell."""
    import litserve

    _, paths, _ = runs
    weights = find_checkpoint(paths[0])
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", *map(str, paths),
                                              "--weights", str(weights)])
    assert code == 1
    assert f"--weights {weights} with several --checkpoint names a file in each run" in err
    assert f"but {paths[1]} has none: every model would serve {weights}" in err
    assert err.count("\n") == 1
    monkeypatch.setattr(litserve.LitServer, "run", lambda self, **options: None)
    assert serve_on_a_free_port(capsys, ["--checkpoint", *map(str, paths),
                                         "--weights", weights.name])[0] == 0
    monkeypatch.chdir(paths[0].parent)  # no best.ckpt here
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", *map(str, paths),
                                              "--weights", f"./{weights.name}"])
    assert code == 1
    assert f"weights file not found: ./{weights.name} ({paths[0].parent / weights.name})" in err


@pytest.mark.parametrize("host, url", [("127.0.0.1", "http://127.0.0.1:{}/"),
                                       ("localhost", "http://127.0.0.1:{}/"),  # was refused
                                       ("::", "http://[::]:{}/")])  # was http://:::8000/
def test_serve_prints_a_url_that_opens(runs, capsys, monkeypatch, host, url):
    """The URL printed at start (LitServe's run replaced: nothing is served here), and the
    process' SIGTERM handler is its own again after serve returns."""
    import litserve

    _, paths, _ = runs
    monkeypatch.setattr(litserve.LitServer, "run", lambda self, **options: None)
    before = signal.getsignal(signal.SIGTERM)

    def serve_once(port: int) -> tuple[tuple[int, bool], str]:
        code = main(["serve", "--checkpoint", str(paths[0]), "--host", host, "--port", str(port)])
        printed = capsys.readouterr()
        return (code, url.format(port) in printed.out), printed.err

    assert on_a_free_port(serve_once)[0] == (0, True)
    assert signal.getsignal(signal.SIGTERM) == before


def test_an_ensemble_is_served_as_one_model(runs):
    """serve --checkpoint first --ensemble second: one model, named first, that translates as
    translate --ensemble does; /info counts both runs' parameters; asked for attention, it
    answers null (the attention would be the first run's alone), and alignments it refuses."""
    from nmt.serve.api import TranslationAPI
    from nmt.serve.models import model_info

    _, paths, sentences = runs
    first, second = map(str, paths)
    api = TranslationAPI({"first": first}, "torch", default_beam=2, max_batch=4,
                         precision="32-true", ensemble=[second])
    api.setup("cpu")
    ensemble = Translator.from_run_dir(first, "cpu", precision="32-true", ensemble=[second])
    job = api.decode_request({"text": sentences[:4], "attention": True})
    answer = api._translate_group([job])[0]
    assert answer["translations"] == expected(ensemble, sentences[:4], 2)
    assert answer["attention"] == [None] * 4
    rejected = api.decode_request({"text": sentences[:1], "alignment": True})
    assert rejected.message.startswith("'alignment' reads one model's attention, and this server "
                                       "decodes an ensemble") and rejected.status == 400
    assert api.decode_request({"text": sentences[:1], "attention_head": 0}).message == \
        "an ensemble answers no attention map: no 'attention_layer' or 'attention_head' to pick"
    info = model_info("first", first, "torch", [second])
    assert (info["family"], info["attention"]) == ("ensemble", None)
    assert (info["attention_layers"], info["attention_heads"]) == (None, None)
    assert [(m["name"], m["family"], m["attention"]) for m in info["members"]] == [
        ("first", "transformer", "scaled_dot"), ("second", "transformer", "scaled_dot")]
    assert info["parameters"] == sum(p.numel() for p in ensemble.model.parameters())


def test_a_run_served_through_a_link_is_named_after_the_link(runs, tmp_path):
    """A model is named after the directory given: a link's name, not its target's (served as
    "first", "current" changed name whenever the link moved to a newer run)."""
    from nmt.serve.models import model_info, served_models

    _, paths, _ = runs
    current = tmp_path / "current"
    current.symlink_to(paths[0], target_is_directory=True)
    assert served_models([str(current), f"{paths[1]}/."], "torch") == {
        "current": str(current), "second": f"{paths[1]}/."}
    assert [m["name"] for m in model_info("current", str(current), "torch", [str(current)])[
        "members"]] == ["current", "current"]


def test_a_served_runs_missing_chosen_weights_are_named_once(runs, tmp_path, capsys):
    """The server's start-up check is quiet about it; the worker's load says it, once."""
    from nmt.serve.api import TranslationAPI
    from nmt.serve.server import build_server

    _, paths, _ = runs
    run = tmp_path / "first"
    shutil.copytree(paths[0], run, ignore=shutil.ignore_patterns("eval"))
    (run / "train_stats.json").write_text(json.dumps({"final_weights": "averaged.ckpt"}))
    build_server([str(run)], "torch", precision="32-true")
    assert "is gone" not in capsys.readouterr().err
    TranslationAPI({"first": str(run)}, "torch", default_beam=2, max_batch=4,
                   precision="32-true").setup("cpu")
    assert capsys.readouterr().err.count(f"{run / 'averaged.ckpt'}, the weights training chose, "
                                         "is gone: using best.ckpt") == 1


@pytest.mark.parametrize("weights, message", [
    (b"garbage", "incompatible or damaged checkpoint"),  # a file cut short or of something else
    (None, "incompatible or damaged checkpoint (Error(s) in loading state_dict"),  # another model's
])
def test_an_ensemble_members_weights_that_do_not_load_are_one_line_before_start(
        runs, capsys, tmp_path, monkeypatch, weights, message):
    """As the run's own: a member's failed in the worker (its traceback, then "the server could
    not start" without why), while translate --ensemble said it in one line."""
    import litserve

    _, paths, _ = runs
    member = tmp_path / "member"
    shutil.copytree(paths[1], member, ignore=shutil.ignore_patterns("eval"))
    chosen = find_checkpoint(member, warn=False)
    if weights is None:
        checkpoint = torch.load(chosen, weights_only=False)
        checkpoint["state_dict"] = {k: v[:1] for k, v in checkpoint["state_dict"].items()}
        torch.save(checkpoint, chosen)
    else:
        chosen.write_bytes(weights)
    monkeypatch.setattr(litserve.LitServer, "run", lambda self, **options: None)  # never starts
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", str(paths[0]), "--ensemble",
                                              str(member)])
    assert code == 1
    assert f"cannot load {chosen}: {message}" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("field, value, message", [
    ("max_len_ratio", -1.0, "decoding.max_len_ratio must be 0 or more, got -1.0"),
    ("alpha", float("nan"), "the length penalty alpha must be a number, got nan"),
    ("prune_margin", -2.0, "the prune margin must be >= 0 nats or none, got -2.0"),
    ("precision", "fp16", "unknown decoding precision 'fp16'"),
])
def test_decoding_options_the_worker_would_refuse_are_one_line_before_start(
        runs, capsys, tmp_path, monkeypatch, field, value, message):
    """A run's config.yaml edited by hand: translate refuses it in one line; serve's worker
    refused it at its warm-up, a traceback in the log and then "the server could not start"."""
    import litserve

    from nmt.config import load_config, save_config

    _, paths, _ = runs
    run = tmp_path / "edited"
    shutil.copytree(paths[0], run, ignore=shutil.ignore_patterns("eval"))
    config = load_config(run / "config.yaml")
    setattr(config.decoding, field, value)
    save_config(config, run / "config.yaml")
    monkeypatch.setattr(litserve.LitServer, "run", lambda self, **options: None)  # never starts
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", str(run)])
    assert code == 1
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv,message", [
    (["{first}", "{second}", "--ensemble", "{second}"], "--ensemble serves one model"),
    (["{first}", "--ensemble", "{missing}"], "checkpoint directory not found"),
    (["{first}", "--ensemble", "{second}", "--engine", "ctranslate2"],
     "--ensemble is for the torch engine"),
])
def test_serve_refuses_an_ensemble_it_cannot_serve_in_one_line(runs, capsys, tmp_path, argv, message):
    _, paths, _ = runs
    names = {"first": paths[0], "second": paths[1], "missing": tmp_path / "missing"}
    code, err = serve_on_a_free_port(capsys, ["--checkpoint", *(arg.format(**names) for arg in argv)])
    assert code == 1
    assert message in err and err.count("\n") == 1
