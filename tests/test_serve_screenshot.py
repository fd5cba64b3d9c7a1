"""scripts/serve_screenshot.py, against a stub of nmt serve's API that serves the real page
(nmt/web/): a model of any name, an ensemble's card without a heatmap, and a page that
shows an error or cannot be reached."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

import pytest

from .conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
MODELS = [  # as /info lists them: an export's name has a dot, the second is an ensemble
    {"name": "small.ct2", "family": "transformer", "attention": "scaled_dot", "src_lang": "de",
     "tgt_lang": "en", "parameters": 10, "engine": "ctranslate2", "attention_layers": 1,
     "attention_heads": 1},
    {"name": "pair", "family": "ensemble", "attention": None, "src_lang": "de", "tgt_lang": "en",
     "parameters": 20, "engine": "torch", "attention_layers": None, "attention_heads": None,
     "members": [{"name": "pair", "family": "transformer", "attention": "scaled_dot"},
                 {"name": "rnn", "family": "rnn", "attention": "additive"}]},
]
HEATMAP = {"source": ["▁Hund", "</s>"], "target": ["▁dog", "</s>"], "weights": [[0.9, 0.1], [0.2, 0.8]]}


class StubAPI(BaseHTTPRequestHandler):
    """The page, /info and /translate as nmt serve answers them (beam over 16: its 400)."""

    def do_GET(self) -> None:
        if self.path == "/info":
            return self.answer(200, {"model": {"models": MODELS, "default_beam": 5}})
        page = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript")}
        if self.path not in page:  # the browser's /favicon.ico
            return self.answer(404, {"error": "Not Found"})
        filename, media_type = page[self.path]
        self.answer(200, (resources.files("nmt") / "web" / filename).read_bytes(), media_type)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["beam"] > 16:
            return self.answer(400, {"error": f"'beam' must be an integer from 1 to 16, got {body['beam']}"})
        ensemble = body["model"] == "pair"
        self.answer(200, {"model": body["model"], "translations": ["A dog."],
                          "attention": [None if ensemble else HEATMAP]})

    def answer(self, status: int, content: dict | bytes, media_type: str = "application/json") -> None:
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        self.send_response(status)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def stub_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def screenshot():
    pytest.importorskip("playwright.sync_api")
    spec = importlib.util.spec_from_file_location("serve_screenshot",
                                                  REPO / "scripts/serve_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(screenshot, monkeypatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["serve_screenshot.py", *argv])
    monkeypatch.setattr(screenshot, "PAGE_SECONDS", 20, raising=False)
    return screenshot.main()


def test_a_model_named_as_an_export_and_an_ensemble_are_drawn(screenshot, stub_url, tmp_path,
                                                              monkeypatch, capsys):
    """A CTranslate2 export's name (small.ct2) made an invalid CSS selector (a Playwright
    traceback), and the script waited 2 minutes for an ensemble's heatmap, which the page
    never draws, then ended in a traceback."""
    out = tmp_path / "page.png"
    assert run(screenshot, monkeypatch, "--url", stub_url, "--out", str(out)) == 0
    assert out.stat().st_size > 0 and capsys.readouterr().out == f"wrote {out}\n"


@pytest.mark.parametrize("argv, message", [
    (["--beam", "40"], "error: the page shows errors: small.ct2: 'beam' must be an integer "
                       "from 1 to 16, got 40; pair: 'beam' must be"),
    (["--text", ""], "error: the page translated nothing: type a sentence and pick at least "
                     "one model"),
])
def test_what_the_page_refuses_is_one_line(screenshot, stub_url, tmp_path, monkeypatch, capsys,
                                           argv, message):
    out = tmp_path / "page.png"
    assert run(screenshot, monkeypatch, "--url", stub_url, "--out", str(out), *argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and not out.exists()


def test_a_server_not_running_is_one_line(screenshot, tmp_path, monkeypatch, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there
    assert run(screenshot, monkeypatch, "--url", url, "--out", str(tmp_path / "page.png")) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: the page at {url}/ did not work: ") and "REFUSED" in err
    assert err.count("\n") == 1
