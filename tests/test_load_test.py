"""scripts/load_test.py: a load test that could not check anything says why in one line."""

from __future__ import annotations

import importlib.util
import socket
import sys

import pytest

from .conftest import REPO


@pytest.fixture(scope="module")
def load_test():
    spec = importlib.util.spec_from_file_location("load_test", REPO / "scripts/load_test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def closed_port() -> int:
    """A port on which nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_server_is_one_line_before_any_load(load_test, tmp_path, monkeypatch, capsys):
    """With no server on the port every request failed, and the percentiles of no latency
    were a StatisticsError traceback, after translating the lines for nothing; then the
    clients spun through refused connections for the whole --seconds before saying so."""
    lines = tmp_path / "in.de"
    lines.write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setattr(load_test, "reference", lambda *args: pytest.fail("nothing to check"))
    monkeypatch.setattr(load_test, "run_load", lambda *args: pytest.fail("no load without a server"))
    monkeypatch.setattr(sys, "argv", ["load_test.py", "--url", url, "--checkpoint", "RUN",
                                      "--input", str(lines), "--clients", "2", "--seconds", "60"])
    with pytest.raises(SystemExit) as ended:
        load_test.main()
    message = str(ended.value.code)
    assert message.startswith(f"error: nothing answers at {url} (") and "refused" in message
    assert message.endswith("start nmt serve first, or give its --url") and "\n" not in message


def test_a_server_that_answers_no_request_is_one_line_not_a_traceback(load_test, monkeypatch):
    """A server that listens but answers every request with an error (another service on the
    port, say): no translation to check, and no percentiles of no latency."""
    records = [(0, 0.01, 404, "Not Found"), (1, 0.01, 404, "Not Found")]
    message = load_test.nothing_answered(records, "http://127.0.0.1:8000")
    assert message == ("error: none of the 2 requests to http://127.0.0.1:8000 was answered; the "
                       "first failed at line 0: HTTP 404: Not Found")


def test_one_answered_request_is_summarised(load_test, capsys):
    """One request answered (the others refused) ended in a traceback: Python 3.11's
    ``statistics.quantiles`` wants two latencies."""
    records = [(0, 0.25, 200, "A dog."), (1, 0.01, 504, "Request timed out")]
    summary = load_test.summarise(records, 1.0, {0: "A dog.", 1: "Two cats."})
    assert summary["errors"] == 1 and summary["wrong_answers"] == 0
    assert summary["p50_ms"] == summary["p99_ms"] == summary["max_ms"] == 250.0
    assert "line 1: HTTP 504: Request timed out" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--clients", "0"], "--clients must be at least 1"),
    (["--seconds", "0"], "--seconds above 0"),
])
def test_a_test_that_would_send_nothing_is_refused(load_test, tmp_path, monkeypatch, capsys,
                                                   argv, message):
    lines = tmp_path / "in.de"
    lines.write_text("Ein Hund.\n", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["load_test.py", "--checkpoint", "RUN", "--input",
                                      str(lines), *argv])
    with pytest.raises(SystemExit):
        load_test.main()
    assert message in capsys.readouterr().err


def test_an_empty_input_is_refused(load_test, tmp_path, monkeypatch, capsys):
    """Every client divided by the number of lines: a ZeroDivisionError traceback per thread."""
    lines = tmp_path / "empty.de"
    lines.write_text("", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["load_test.py", "--checkpoint", "RUN", "--input", str(lines)])
    with pytest.raises(SystemExit):
        load_test.main()
    assert "holds no lines to send" in capsys.readouterr().err


@pytest.mark.parametrize("name, content, message", [
    ("missing.de", None, "No such file or directory"),
    ("latin1.de", "Männer\n".encode("latin-1"), "can't decode byte 0xe4"),
    ("plain.de.gz", b"Ein Hund.\n", "Not a gzipped file"),
])
def test_an_unreadable_input_is_one_line(load_test, tmp_path, monkeypatch, capsys, name, content,
                                         message):
    """An --input that is missing, not UTF-8 or not gzip (named .gz) was a traceback."""
    lines = tmp_path / name
    if content is not None:
        lines.write_bytes(content)
    monkeypatch.setattr(sys, "argv", ["load_test.py", "--checkpoint", "RUN", "--input", str(lines)])
    with pytest.raises(SystemExit):
        load_test.main()
    err = capsys.readouterr().err
    assert f"error: --input {lines} cannot be read: " in err and message in err
    assert "Traceback" not in err


def test_a_checkpoint_translate_refuses_is_one_line(load_test, tmp_path, capsys):
    """A --checkpoint that nmt translate refuses (a typo: no such run) was, after the whole
    load, a CalledProcessError traceback that hid translate's own error."""
    with pytest.raises(SystemExit) as ended:
        load_test.reference(str(tmp_path / "nope"), ["Ein Hund."], 5, "torch", None)
    assert ended.value.code == (f"error: nmt translate --checkpoint {tmp_path / 'nope'}, the reference "
                                f"the answers are checked against, failed: checkpoint directory not "
                                f"found: {tmp_path / 'nope'}")
