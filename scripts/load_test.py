"""Load test of a local ``nmt serve``: N concurrent clients send one sentence per request for
a fixed time, then every answer is checked against ``nmt translate`` on the same lines.

    nmt serve --checkpoint RUN --port 8000 &
    python scripts/load_test.py --checkpoint RUN --input data/multi30k/test_2016_flickr.de.gz

Bounded: localhost only, ``--seconds`` of sending (requests in flight then finish, each
within ``--timeout``), then it stops. Prints a Markdown table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

LOCAL_HOSTS = ("127.0.0.1", "localhost")


def read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def post(url: str, body: dict, timeout: float) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {"error": err.read().decode(errors="replace")}


def client(url: str, lines: list[str], next_line, deadline: float, body: dict, timeout: float,
           records: list) -> None:
    """Send one line per request until the deadline, at least one; record (line, latency,
    status, text), text being the translation, or a failed request's error (status 0: no
    answer)."""
    while True:
        number = next(next_line) % len(lines)
        start = time.monotonic()
        try:
            status, answer = post(url, {**body, "text": [lines[number]]}, timeout)
            text = answer["translations"][0] if status == 200 else answer["error"]
        except (OSError, ValueError) as err:  # refused, reset, timed out, not JSON: an error
            status, text = 0, str(err)
        records.append((number, time.monotonic() - start, status, text))
        if time.monotonic() >= deadline:
            return


def run_load(url: str, lines: list[str], clients: int, seconds: float, body: dict,
             timeout: float) -> tuple[list, float]:
    """All clients at once for ``seconds``; returns the records and the wall time."""
    records: list = []  # list.append is atomic under the GIL
    counter = itertools.count()
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=client, args=(url, lines, counter, deadline, body,
                                                     timeout, records)) for _ in range(clients)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records, time.monotonic() - start


def reference(checkpoint: str, lines: list[str], beam: int, engine: str,
              precision: str | None) -> list[str]:
    """``nmt translate`` on the same lines, in one process, as the ground truth."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "lines.txt"
        source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        command = [sys.executable, "-m", "nmt", "translate", "--checkpoint", checkpoint,
                   "--beam", str(beam), "--engine", engine, "--input", str(source),
                   *(["--precision", precision] if precision else [])]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:  # its one-line error, last on stderr, after any notes
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        sys.exit(f"error: nmt translate --checkpoint {checkpoint}, the reference the answers "
                 f"are checked against, failed: {said.removeprefix('error: ')}")
    return done.stdout.splitlines()


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile; one value is each of its own (Python 3.11's ``quantiles``
    refuses fewer than two: one answered request ended the test in a traceback)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def failure(record: tuple) -> str:
    """A failed request in words: its line, and the server's status and error."""
    number, _, status, error = record
    return f"line {number}: " + (f"HTTP {status}: {error}" if status else f"no answer: {error}")


def nothing_answered(records: list, url: str) -> str:
    """The one-line error of a test in which no request was answered, naming the first
    failure (a server not running, on another port, refusing every request)."""
    return (f"error: none of the {len(records):,} requests to {url} was answered; the first "
            f"failed at {failure(records[0])}")


def check_server_listens(url: str, timeout: float) -> None:
    """Exit in one line where nothing answers at ``url`` at all: the clients would otherwise
    spin through refused connections for the whole test (26,871 in 2 s on a 2-core EPYC)."""
    try:
        urllib.request.urlopen(url + "/info", timeout=timeout).close()
    except urllib.error.HTTPError:  # something answers: the test tells what
        pass
    except OSError as err:  # refused, unreachable, timed out
        sys.exit(f"error: nothing answers at {url} ({getattr(err, 'reason', err)}): start "
                 "nmt serve first, or give its --url")


def summarise(records: list, wall: float, expected: dict[int, str]) -> dict:
    ok = [r for r in records if r[2] == 200]
    latencies = [r[1] for r in ok] or [0.0]
    wrong = [r for r in ok if r[3] != expected[r[0]]]
    # An answer that is another sentence's translation is a routing bug; one that is no
    # sentence's is this sentence decoded differently (bf16 numerics depend on the batch).
    translations = set(expected.values())
    misrouted = [r for r in wrong if r[3] in translations]
    for number, _, _, text in wrong[:5]:
        print(f"line {number}: translate gives {expected[number]!r}, the server {text!r}",
              file=sys.stderr)
    for record in [r for r in records if r[2] != 200][:5]:
        print(failure(record), file=sys.stderr)
    return {"requests": len(records), "errors": len(records) - len(ok),
            "wrong_answers": len(wrong), "misrouted": len(misrouted), "seconds": round(wall, 1),
            "throughput_req_per_s": round(len(ok) / wall, 1),
            "p50_ms": round(1000 * percentile(latencies, 50), 1),
            "p95_ms": round(1000 * percentile(latencies, 95), 1),
            "p99_ms": round(1000 * percentile(latencies, 99), 1),
            "max_ms": round(1000 * max(latencies), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--checkpoint", required=True, help="the run (or export) being served")
    parser.add_argument("--input", required=True, help="source sentences, one per line (.gz ok)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--model", help="served model name (default: the server's first)")
    parser.add_argument("--engine", default="torch", help="what the server runs: torch | ctranslate2")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--precision", help="the server's --precision, if it was given one")
    args = parser.parse_args()
    if urlparse(args.url).hostname not in LOCAL_HOSTS:
        parser.error("--url must be on this machine (127.0.0.1 or localhost)")
    if args.clients < 1 or not args.seconds > 0:
        parser.error("--clients must be at least 1 and --seconds above 0: nothing would be sent")
    try:
        lines = read_lines(args.input)
    except (OSError, UnicodeDecodeError) as err:  # not found, a folder, not gzip, not UTF-8
        parser.error(f"--input {args.input} cannot be read: {getattr(err, 'strerror', None) or err}")
    if not lines:
        parser.error(f"--input {args.input} holds no lines to send")
    body = {"beam": args.beam, **({"model": args.model} if args.model else {})}
    check_server_listens(args.url, args.timeout)
    records, wall = run_load(args.url + "/translate", lines, args.clients, args.seconds, body,
                             args.timeout)
    if not any(record[2] == 200 for record in records):  # nothing to check against translate
        sys.exit(nothing_answered(records, args.url))
    sent = sorted({record[0] for record in records})
    expected = dict(zip(sent, reference(args.checkpoint, [lines[i] for i in sent], args.beam,
                                        args.engine, args.precision)))
    summary = {"clients": args.clients, "beam": args.beam, **summarise(records, wall, expected)}
    keys = list(summary)
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    print("| " + " | ".join(str(summary[k]) for k in keys) + " |")
    print(json.dumps(summary))
    return 0 if summary["errors"] == 0 and summary["wrong_answers"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
