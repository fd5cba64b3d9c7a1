"""Benchmarks run and report sane numbers (no speed assertions: those are not tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from nmt.attention import SCORERS
from nmt.bench_attention import _time_point, growth_exponent, scorer_exponents
from nmt.cli import main
from nmt.plots import check_picture_path
from nmt.precision import cpu_identity
from nmt.translator import Translator

from .conftest import REPO, tiny_options, tiny_train_args, write_corpus


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_growth_exponent_recovers_power_law():
    lengths = [16, 32, 64, 128]
    assert growth_exponent(lengths, [3 * n**2 for n in lengths]) == pytest.approx(2.0)
    assert growth_exponent(lengths, [5 * n for n in lengths]) == pytest.approx(1.0)


def test_scorer_exponents_fit_the_longer_half_and_skip_memory_under_resolution():
    rows = [{"scorer": name, "length": n, "ms": 2 * n**2, "peak_mb": mb(n)}
            for name, mb in (("big", lambda n: n**2 / 100), ("small", lambda n: n / 100))
            for n in (16, 32, 64, 128, 256, 512)]
    exponents = scorer_exponents(rows)
    assert exponents["big"]["time"] == pytest.approx(2.0)
    assert exponents["big"]["memory"] == pytest.approx(2.0)  # 164 .. 2621 MB: measurable
    assert exponents["small"]["memory"] is None  # 1.3 .. 5.1 MB: the allocator's noise


def test_bench_attention(tmp_path, capsys):
    plot = tmp_path / "attention.png"
    assert main(["bench", "attention", "--max-len", "32", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    summary = last_json(out)
    assert {r["scorer"] for r in summary["rows"]} == set(SCORERS)
    assert all(r["ms"] > 0 for r in summary["rows"]) and plot.is_file()
    assert set(summary["exponents"]) == set(SCORERS)
    # the figures name their CPU and precision (the README's table could not: not noted)
    assert summary["device"] == f"CPU: {cpu_identity()}" and summary["precision"] == "32-true"
    assert f"measured on CPU: {cpu_identity()}, 32-true, {summary['threads']} threads" in out
    assert f"plot of time against length: {plot}" in out  # drawn where no one looked, unsaid
    # at these lengths the peaks are under the RSS resolution: the empty exponents are explained
    assert all(v["memory"] is None for v in summary["exponents"].values())
    assert "a memory exponent needs peaks of 32 MB or more" in out


def test_bench_attention_keeps_the_rows_that_fit_in_memory(tmp_path, capsys, monkeypatch):
    # Each point may allocate 40 MB: the additive scorers' (B, H, T, S, d) scores fill that by
    # length 128, the dot products' (B, H, T, S) ones do not; a point that fails ends its scorer,
    # not the bench. One scorer of each kind, additive first: each point is a fresh process, and
    # test_bench_attention runs every scorer.
    # Each point's process runs the bench's threads (conftest.py: at most 2): every thread's
    # buffers count against the limit, and with 16 (an H200 machine's host) dot at 256 no
    # longer fit in 40 MB (13.6 MB with 2 there).
    from nmt import bench_attention

    monkeypatch.setattr(bench_attention, "SCORERS", {name: SCORERS[name] for name in ("additive", "dot")})
    assert main(["bench", "attention", "--max-len", "256", "--memory-limit-mb", "40",
                 "--plot", ""]) == 0
    out = capsys.readouterr().out
    rows = last_json(out)["rows"]
    additive = [r for r in rows if r["scorer"] == "additive"]
    assert additive[-1]["error"] == "out of memory" and additive[-1]["ms"] is None
    assert all(r["ms"] > 0 for r in additive[:-1]) and additive[-1]["length"] <= 128
    assert f"additive: out of memory at length {additive[-1]['length']}" in out
    dot = [r for r in rows if r["scorer"] == "dot"]
    assert [r["length"] for r in dot] == [16, 32, 64, 128, 256] and all(r["ms"] > 0 for r in dot)
    assert "| error |" in out.splitlines()[0]


@pytest.mark.parametrize("config, options", [
    ("rnn_bahdanau", ["model.emb_dim=16", "model.hidden_size=32", "model.attention_dim=32"]),
    ("transformer", ["model.d_model=32", "model.heads=2", "model.ff_dim=64"]),
])
def test_forward_flops_are_torchs_count_of_a_padded_batch(config, options):
    """The FLOPs behind bench train's MFU, against torch's count of the same forward. The
    RNN's encoder runs packed, so padding costs it nothing: counting it (0.8% on the default
    config's Multi30k batches, 9% here) overstated the MFU. (The additive scorer's count
    includes its tanh and sums.)"""
    from torch.utils.flop_counter import FlopCounterMode

    from nmt.config import load_config
    from nmt.data.tokenizer import PAD
    from nmt.models import build_model

    model = build_model(load_config(f"configs/{config}.yaml", options).model, 100).eval()
    src, tgt = torch.randint(4, 100, (3, 10)), torch.randint(4, 100, (3, 7))
    src[1:, -4:] = PAD
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(src, src != PAD, tgt)
    counted = counter.get_total_flops()
    assert counted <= model.forward_flops(src, tgt) <= 1.03 * counted


def exit_like_the_oom_killer(*args) -> dict:
    os._exit(137)


def test_a_point_whose_process_dies_is_a_row_not_the_end_of_the_bench():
    row = _time_point("dot", 64, 1, 1, 8, 1, measure=exit_like_the_oom_killer)
    assert row == {"scorer": "dot", "length": 64, "ms": None, "peak_mb": None,
                   "error": "its process died"}


def test_bench_attention_refuses_a_picture_name_matplotlib_cannot_write(tmp_path, capsys):
    assert main(["bench", "attention", "--plot", str(tmp_path / "times.txt")]) == 1
    out, err = capsys.readouterr()
    assert "cannot draw a picture named" in err and ".png" in err and "Traceback" not in err
    assert out == ""  # refused before anything was timed
    check_picture_path(tmp_path / "times")  # no suffix: matplotlib writes a PNG
    assert main(["bench", "attention", "--plot", str(tmp_path)]) == 1  # it drew {tmp_path}.png
    err = capsys.readouterr().err
    assert f"cannot draw a picture named {tmp_path}: it is a folder" in err and err.count("\n") == 1
    assert not tmp_path.with_suffix(".png").exists()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    files = write_corpus(folder)
    assert main(tiny_train_args(files, folder / "run", folder / "data", epochs=1)) == 0
    return tiny_options(files, folder / "data"), folder / "run"


def test_bench_train(tiny, capsys, caplog):
    options, _ = tiny
    capsys.readouterr()
    assert main(["bench", "train", *options, "--steps", "3", "--warmup", "1"]) == 0
    summary = last_json(capsys.readouterr().out)
    # Lightning's end at the steps the bench asked for is not among its results
    assert not [r for r in caplog.records if "Trainer.fit` stopped" in r.getMessage()]
    assert summary["steps"] == 3 and summary["tgt_tok_per_s"] > 0
    assert summary["device"].startswith("CPU: ")  # where it trained (compare --cost tables it)
    assert summary["train_gflop_per_tgt_token"] > 0 and 0 < summary["mfu"]
    mixed = summary["precision"] != "32-true"
    assert (summary["precision_peak_gflops"] != summary["fp32_peak_gflops"]) == mixed
    achieved = summary["achieved_gflops"]
    assert summary["mfu"] == pytest.approx(achieved / summary["precision_peak_gflops"], abs=0.002)
    assert summary["fp32_peak_utilisation"] == pytest.approx(achieved / summary["fp32_peak_gflops"],
                                                             abs=0.002)


class SignalAtFirstStep(Callback):
    """A stop (SIGTERM, Ctrl-C) arriving as the bench trains."""

    def __init__(self, signum: int):
        self.signum = signum

    def on_train_batch_start(self, *args) -> None:
        signal.raise_signal(self.signum)


@pytest.mark.parametrize("signum, status, line", [
    (signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted")])
def test_bench_train_stopped_says_so(tiny, capsys, monkeypatch, ctrl_c_raises, signum, status, line):
    """Stopped by SIGTERM, bench train exited 0 without a word (Lightning's bare SystemExit),
    as if it had measured; by Ctrl-C, 1 (Lightning's sys.exit(1))."""
    import nmt.bench

    made = nmt.bench.benchmark_trainer
    monkeypatch.setattr(nmt.bench, "benchmark_trainer", lambda config, steps, callbacks, precision:
                        made(config, steps, [*callbacks, SignalAtFirstStep(signum)], precision))
    options, _ = tiny
    capsys.readouterr()
    assert main(["bench", "train", *options, "--steps", "3", "--warmup", "1"]) == status
    out, err = capsys.readouterr()
    assert err.splitlines()[-1] == line and "{" not in out  # no results


@pytest.mark.parametrize("option, message", [
    # a precision Lightning takes but training cannot run (a scatter of two dtypes in the loss)
    ("trainer.precision=bf16-true", "error: trainer.precision bf16-true: "),
    # every pair longer than max_len: a ZeroDivisionError
    ("data.max_len=1", "error: no training pair is left to train on: "),
])
def test_bench_train_refuses_what_training_refuses(tiny, capsys, option, message):
    """Each was a traceback; now the one line nmt train gives."""
    options, _ = tiny
    capsys.readouterr()
    assert main(["bench", "train", *options, "--steps", "3", option]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(message) and not any("Traceback" in line for line in err), err


def test_bench_train_accumulates_as_training_does(tiny, capsys):
    """trainer.accumulate_grad_batches=2 was ignored: the bench timed steps of one batch."""
    options, _ = tiny
    summaries = []
    for accumulate in (1, 2):
        capsys.readouterr()
        assert main(["bench", "train", *options, "--steps", "2", "--warmup", "1",
                     f"trainer.accumulate_grad_batches={accumulate}"]) == 0
        summaries.append(last_json(capsys.readouterr().out))
    one, two = summaries
    assert one["steps"] == two["steps"] == 2
    # two batches a step: about twice the tokens (batches differ in length)
    assert 1.5 < two["tgt_tokens_per_step"] / one["tgt_tokens_per_step"] < 2.5


def product_clock(gflops: float):
    """A ``time.perf_counter`` under which each n x n product ``cpu_peak_size`` times takes
    2 n^3 / ``gflops`` ns: it reads the clock twice a size, for n = 256, 512, 1024."""
    now, reads, sizes = 0.0, 0, iter([256, 512, 1024])

    def clock() -> float:
        nonlocal now, reads
        reads += 1
        if reads % 2 == 0:  # the product's end
            now += 2 * next(sizes) ** 3 / (gflops * 1e9)
        return now

    return clock


@pytest.mark.parametrize("dtype,gflops,size", [
    (torch.float32, 100.0, 2048),  # kernels, a quiet machine: the 2048 reference
    (torch.float32, 20.0, 1024),  # a 1024 product 0.11 s: a 2048 one would take 0.86 s
    (torch.float16, 2.0, 512),  # no fp16 kernels: a 1024 product would take 1.07 s
    (torch.float16, 1e-3, 256),  # every product seems to take long: the smallest
])
def test_the_cpu_peak_is_measured_at_2048_unless_a_product_would_take_long(monkeypatch, dtype, gflops,
                                                                           size):
    """fp16 on a CPU without fp16 kernels (1-3 GFLOP/s) spent minutes on ten 2048 products
    under bench train with 16-mixed; a type with kernels keeps the 2048 reference. The clock
    is the test's: with the machine's, a busy one (the suite under xdist beside trainings on a
    16-core Xeon) took over 1/16 s for a 1024 fp32 product and got 1024."""
    from nmt import bench

    monkeypatch.setattr(bench.time, "perf_counter", product_clock(gflops))
    assert bench.cpu_peak_size(dtype) == size


def test_bench_decode_resolves_auto_once_at_each_beam(tiny, capsys, monkeypatch, tmp_path):
    """--precision auto was resolved twice, for the translator (whose precision the speed-ups
    are against) and again for the torch rows. A probe whose rounds disagree (a busy machine)
    is not cached, so the second could choose otherwise: no row was at the first's precision,
    every speed-up was left out (test_export: KeyError 'ctranslate2_float32_speedup'), and the
    probe's wait and lines came twice. It is resolved once at each beam, by a probe at that
    beam (it probed the run's decoding.beam_size for every beam), for the sentences decoded."""
    from nmt import precision

    _, run = tiny
    monkeypatch.setattr(precision, "CACHE", tmp_path / "precision.json")
    monkeypatch.setattr(precision, "has_native_bf16", lambda: True)
    bf16_seconds = {1: iter([0.5, 2.0]), 2: iter([2.0, 0.5])}  # a busy machine: one, then other
    probed = []

    def unsteady_probe(model, sentences, beam, rounds=2, half="bf16"):
        probed.append((sentences, beam))
        return {"fp32": 1.0, "bf16": next(bf16_seconds[beam]), "steady": False}

    monkeypatch.setattr(precision, "time_decoding", unsteady_probe)
    assert main(["bench", "decode", "--checkpoint", str(run), "--beam", "1,2", "--split", "test",
                 "--limit", "4", "--repeat", "1"]) == 0
    out, err = capsys.readouterr()
    summary = last_json(out)
    # at each beam, for the --limit sentences decoded (it timed a full batch, 500 at most)
    assert probed == [(4, 1), (4, 2)] and err.count("precision auto: timing") == 2
    assert [(r["precision"], r["mode"]) for r in summary["rows"]] == [
        ("bf16-mixed", "greedy"), ("32-true", "beam2"), ("bf16-mixed", "greedy_recompute")]
    assert set(summary["beam_cost_vs_greedy"]) == {"greedy", "beam2", "greedy_recompute"}


def test_bench_decode(tiny, capsys):
    _, run = tiny
    assert main(["bench", "decode", "--checkpoint", str(run), "--beam", "1,3",
                 "--split", "test", "--limit", "10", "--precision", "32-true,bf16-mixed",
                 "--repeat", "2"]) == 0
    summary = last_json(capsys.readouterr().out)
    rows = [(r["precision"], r["mode"]) for r in summary["rows"]]
    assert rows == [("32-true", "greedy"), ("bf16-mixed", "greedy"), ("32-true", "beam3"),
                    ("bf16-mixed", "beam3"), ("32-true", "greedy_recompute")]
    assert all(0 <= r["bleu"] <= 100 for r in summary["rows"][:4])
    assert summary["sentences"] == 10 and summary["beam_cost_vs_greedy"]["greedy"] == 1.0
    assert summary["passes"] == 2 and all(r["slowest_pass"] >= r["seconds"] for r in summary["rows"][:4])
    seconds = {(r["precision"], r["mode"]): r["seconds"] for r in summary["rows"]}
    for mode in ("greedy", "beam3"):
        assert summary["torch_bf16-mixed_speedup"][mode] == pytest.approx(
            seconds["32-true", mode] / seconds["bf16-mixed", mode], abs=0.006)
    assert main(["bench", "decode", "--checkpoint", str(run), "--precision", "fp8"]) == 1
    assert "unknown precision 'fp8'" in capsys.readouterr().err
    assert main(["bench", "decode", "--checkpoint", str(run), "--beam", "1", "--limit", "4",
                 "--precision", "32-true", "--repeat", "1", "--no-recompute"]) == 0
    assert [r["mode"] for r in last_json(capsys.readouterr().out)["rows"]] == ["greedy"]
    # a beam or an engine named twice is one setting, timed once: one row
    assert main(["bench", "decode", "--checkpoint", str(run), "--beam", "3,1,3", "--limit", "4",
                 "--engine", "torch,torch", "--precision", "32-true", "--repeat", "1",
                 "--no-recompute"]) == 0
    assert [r["mode"] for r in last_json(capsys.readouterr().out)["rows"]] == ["beam3", "greedy"]


@pytest.mark.parametrize("precision, dtype", [("bf16-mixed", torch.bfloat16), ("32-true", torch.float32)])
def test_decoding_runs_in_the_chosen_precision(tiny, precision, dtype):
    """The model's layers really compute in the decoding precision; scores stay floats."""
    _, run = tiny
    translator = Translator.from_run_dir(run, "cpu", precision=precision)
    layer = next(m for m in translator.model.modules() if isinstance(m, torch.nn.Linear))
    seen = []
    hook = layer.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    hyps = translator.translate(["haus mann", "katze"], beam_size=2)
    hook.remove()
    assert seen and set(seen) == {dtype}
    assert all(isinstance(h[0].score, float) for h in hyps)


def _dies(results) -> None:
    raise SystemExit(3)


def test_a_bench_data_stage_that_dies_is_an_error_not_a_wait():
    """A stage process that crashed before reporting left bench data waiting for ever."""
    from nmt.bench_data import _in_fresh_process
    from nmt.errors import NMTError

    with pytest.raises(NMTError, match=r"the dies process failed \(exit 3\)"):
        _in_fresh_process(_dies)


def _refuses(results) -> None:
    from nmt.errors import NMTError

    raise NMTError("SentencePiece training failed: too few pieces")


def test_a_bench_data_stage_that_refuses_is_its_one_line(capfd):
    """A stage's own one-line error (SentencePiece refusing a vocabulary) came out as the
    spawned process's traceback, then "the prepare_stage process failed"."""
    from nmt.bench_data import _in_fresh_process
    from nmt.errors import NMTError

    with pytest.raises(NMTError, match="^SentencePiece training failed: too few pieces$"):
        _in_fresh_process(_refuses)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("option, message", [
    ("model.bogus=1", "unknown model option 'bogus'"),  # before the stages
    ("data.max_len=1", "no training pair is left to train on"),  # the train stage's own line
])
def test_bench_data_refuses_what_training_refuses(tmp_path, capfd, option, message):
    assert main(["bench", "data", "--pairs", "50", "--steps", "1", "--dir", str(tmp_path / "b"),
                 option]) == 1
    err = capfd.readouterr().err
    assert message in err.splitlines()[-1] and "Traceback" not in err, err


def test_bench_data_leaves_no_prepared_folder_behind(tmp_path, capsys):
    """Each run writes its corpus anew, to be prepared again as measured: the prepared folder
    of every earlier run was left under --dir, hundreds of MB each for a large corpus."""
    options = ["data.vocab_size=100", "model.d_model=32", "model.heads=2", "model.ff_dim=64",
               "model.encoder_layers=1", "model.decoder_layers=1", "trainer.precision=32-true"]
    assert main(["bench", "data", "--pairs", "60", "--steps", "1", "--dir", str(tmp_path / "b"),
                 *options]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["prepare_s"] >= 0
    assert sorted(path.name for path in (tmp_path / "b").iterdir()) == ["corpus"]


def _sleeping_stage(seconds: float, results) -> None:
    time.sleep(seconds)


def test_a_stop_while_a_stage_starts_stops_the_stage(monkeypatch, ctrl_c_raises):
    """A stop arriving inside Process.start (between the spawn and the hand-over of its
    arguments) left the stage unknown to the code that stops it: it ran on alone (or, cut off
    from its arguments, printed an EOFError traceback; clean-clone CI, once)."""
    import multiprocessing.context

    from nmt.bench_data import _in_fresh_process

    started = []
    start = multiprocessing.context.SpawnProcess.start

    def start_then_interrupted(process):
        start(process)
        started.append(process)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as start returns

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        _in_fresh_process(_sleeping_stage, 60.0)
    [process] = started
    process.join(timeout=30)
    assert process.exitcode == -signal.SIGTERM  # stopped with it, not sleeping on


def test_stop_signals_are_taken_after_the_block_they_arrived_in(ctrl_c_raises):
    from nmt.errors import stop_signals_deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with stop_signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the block's end")
    assert done == ["the block's end"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_bench_data_stopped_by_sigterm_leaves_no_prepared_folder_or_stage(tmp_path):
    """SIGTERM (kill, a scheduler) killed the command outright: its temporary prepared folder
    stayed under --dir, and the stage's process (preparing, or training) ran on alone into it.
    As on Ctrl-C, the stage is now stopped and the folder removed; exit 143."""
    options = ["data.vocab_size=100", "model.d_model=32", "model.heads=2", "model.ff_dim=64",
               "model.encoder_layers=1", "model.decoder_layers=1", "trainer.precision=32-true"]
    folder = tmp_path / "b"
    process = subprocess.Popen(
        [sys.executable, "-m", "nmt", "bench", "data", "--pairs", "60", "--steps", "1", "--dir",
         str(folder), *options], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGTERM,
                                                                            signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(folder.glob("data.*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)  # while the temporary folder is there
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.endswith("stopped by SIGTERM\n"), err
    assert sorted(path.name for path in folder.iterdir()) == ["corpus"]
    for _ in range(100):  # its stage (and multiprocessing's resource tracker) gone with it
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a process of the bench outlived it")


def test_bench_train_counts_the_flops_of_a_family_without_its_own_count(toy_registries, tmp_path,
                                                                        capsys):
    """A new family, one class and its registry entry: bench train was an AttributeError after
    its first timed step (no ``forward_flops``), and so was compare --cost. Torch counts them.
    Its summary named the attention null where the config left the family's default."""
    from .toys import toy_config

    config = toy_config(tmp_path, write_corpus(tmp_path))
    capsys.readouterr()
    assert main(["bench", "train", "--config", config, "--steps", "2", "--warmup", "1"]) == 0
    summary = last_json(capsys.readouterr().out)
    assert summary["model"] == "toy" and summary["mfu"] > 0  # (its GFLOP per token reads 0.0)
    assert summary["attention"] == "toy_cosine"  # the family's default: the config names none


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_torchs_flop_count_of_a_forward_pass_matches_the_familys_own(family):
    """The count bench train takes for a family without ``forward_flops`` (torch's counter of
    a forward pass) is the shipped families' own, but for the additive scorer's elementwise
    (T, S, A) work, which counts no matmul: measured on dot-product attention here."""
    from nmt.bench import forward_flops
    from nmt.data.tokenizer import PAD

    from .conftest import tiny_model

    model = tiny_model(family, "scaled_dot" if family == "transformer" else "dot", vocab=30)

    class Unnamed(torch.nn.Module):  # the same model, without its own count
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, *inputs):
            return self.inner(*inputs)

    src, tgt_in = torch.randint(4, 30, (3, 7)), torch.randint(4, 30, (3, 5))
    src[0, 5:] = PAD  # counted by both, as the matmuls compute it
    assert forward_flops(Unnamed(), src, tgt_in) == model.forward_flops(src, tgt_in) > 0
