"""precision: auto decides by measurement on CPU, and says why."""

import errno
import json
import random
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nmt import precision
from nmt import trainer as trainer_module
from nmt.cli import main
from nmt.config import load_config
from nmt.errors import NMTError

from .conftest import reversal_batch, tiny_model, tiny_train_args, write_corpus


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "CACHE", tmp_path / "precision.json")
    monkeypatch.setattr(precision, "has_native_bf16", lambda: True)
    return tmp_path / "precision.json"


def fake_timing(monkeypatch, fp32: float, bf16: float) -> list:
    calls = []

    def timing(shapes, rounds=2):
        calls.append(shapes)
        return {"fp32": fp32, "bf16": bf16, "steady": True}

    monkeypatch.setattr(precision, "time_matmuls", timing)
    return calls


def test_explicit_precision_is_kept():
    def unused():
        raise AssertionError("a precision set in the config is not measured")

    assert precision.resolve_precision("32-true", unused).precision == "32-true"
    assert precision.resolve_precision("bf16-mixed", unused).reason == "set in the config"


@pytest.mark.parametrize("fp32, bf16, chosen", [(1.0, 0.4, "bf16-mixed"),  # AMD / AMX: bf16 fast
                                                (1.0, 2.0, "32-true"),  # Intel without AMX
                                                (1.0, 0.95, "32-true")])  # within the margin
def test_cpu_takes_the_faster_precision(cache, monkeypatch, fp32, bf16, chosen):
    fake_timing(monkeypatch, fp32, bf16)
    choice = precision.choose_cpu_precision([(8, 8, 8)])
    assert choice.precision == chosen
    assert f"{fp32 / bf16:.2f}x" in choice.reason and precision.cpu_model() in choice.reason


def test_the_probe_leaves_a_seeded_runs_random_numbers_alone(cache):
    """Training builds the Trainer, whose precision ``auto`` probes the machine unless cached,
    before the model: a probe drawing from the global generator would give a seed other
    initial weights on a machine seen for the first time."""
    torch.manual_seed(1)
    before = torch.get_rng_state()
    assert precision.choose_cpu_precision([(64, 32, 48)]).measured  # nothing cached yet
    assert torch.equal(torch.get_rng_state(), before)


def test_probe_is_cached_per_shapes(cache, monkeypatch):
    calls = fake_timing(monkeypatch, 1.0, 0.5)
    first = precision.choose_cpu_precision([(8, 8, 8)])
    again = precision.choose_cpu_precision([(8, 8, 8)])
    assert len(calls) == 1 and "cached" in again.reason and first.precision == again.precision
    precision.choose_cpu_precision([(16, 8, 8)])  # other shapes: probed anew
    assert len(calls) == 2 and cache.is_file()


def test_no_native_bf16_means_fp32(cache, monkeypatch):
    monkeypatch.setattr(precision, "has_native_bf16", lambda: False)
    calls = fake_timing(monkeypatch, 1.0, 0.1)
    assert precision.choose_cpu_precision([(8, 8, 8)]).precision == "32-true"
    assert not calls  # nothing to measure


def test_real_probe_times_both_types():
    timing = precision.time_matmuls([(32, 16, 24)], rounds=1)
    assert set(timing) == {"fp32", "bf16", "steady"} and timing["fp32"] > 0 and timing["bf16"] > 0


@pytest.mark.parametrize("text", ["[1, 2]", "not json", '"a string"'])
def test_a_cache_that_is_no_json_object_is_measured_anew_and_replaced(cache, monkeypatch, text):
    fake_timing(monkeypatch, 1.0, 0.5)
    cache.write_text(text)
    assert precision.choose_cpu_precision([(8, 8, 8)]).measured
    assert not precision.choose_cpu_precision([(8, 8, 8)]).measured  # stored this time


@pytest.mark.parametrize("entry", ["fast", None, {}, {"fp32": 1.0}, {"fp32": "1", "bf16": 0.5},
                                   {"fp32": 1.0, "bf16": 0.0}, {"fp32": float("nan"), "bf16": 0.5},
                                   {"fp32": 10**400, "bf16": 0.5}, {"fp32": True, "bf16": 0.5}])
def test_a_cache_entry_that_is_no_timing_is_measured_anew_and_replaced(cache, monkeypatch, entry):
    """A hand-edited or damaged entry (this machine's key, no pair of positive seconds) is no
    traceback and no choice made on it: the probe runs again and its timing replaces it."""
    fake_timing(monkeypatch, 1.0, 0.5)
    precision.choose_cpu_precision([(8, 8, 8)])
    cache.write_text(json.dumps(dict.fromkeys(json.loads(cache.read_text()), entry)))
    again = precision.choose_cpu_precision([(8, 8, 8)])
    assert again.measured and again.precision == "bf16-mixed"
    assert not precision.choose_cpu_precision([(8, 8, 8)]).measured  # stored this time


def test_training_precision_uses_the_model_shapes(cache, monkeypatch, capsys):
    calls = fake_timing(monkeypatch, 1.0, 0.5)
    config = load_config("configs/rnn_bahdanau.yaml", ["trainer.precision=auto", "trainer.accelerator=cpu"])
    choice = trainer_module.training_precision(config)
    assert choice.precision == "bf16-mixed"
    # The decoder cell's gates over [y (256); c (512)], the output layer tied to the 256-dim embedding.
    assert calls[0] == [(512, 512, 512), (512, 768, 1536), (512, 256, 8000)]
    assert "precision: bf16-mixed" in capsys.readouterr().out


@pytest.mark.parametrize("rank", [0, 1])
def test_only_the_first_ddp_process_says_what_it_probes_and_chose(cache, monkeypatch, capsys, rank):
    """Every DDP process resolves the precision; rank 0 alone prints the probe's notice
    (stderr) and the choice (stdout), as Lightning's other output."""
    fake_timing(monkeypatch, 1.0, 0.5)
    monkeypatch.setattr(trainer_module.rank_zero_only, "rank", rank)
    monkeypatch.setattr(trainer_module, "_announced", set())
    config = load_config("configs/rnn_bahdanau.yaml", ["trainer.precision=auto", "trainer.accelerator=cpu"])
    assert trainer_module.training_precision(config).precision == "bf16-mixed"
    printed = capsys.readouterr()
    assert ("precision auto: timing" in printed.err) == (rank == 0)
    assert ("precision: bf16-mixed" in printed.out) == (rank == 0)
    assert rank == 0 or printed.out == printed.err == ""


@pytest.mark.parametrize("option, message", [
    ("trainer.strategy=bogus", "trainer option rejected by Lightning: You selected an invalid strategy"),
    ("trainer.accelerator=bogus",
     "trainer option rejected by Lightning: You selected an invalid accelerator"),
    ("trainer.devices=abc", "trainer option rejected by Lightning: `devices` selected with "),
    ("trainer.num_nodes=0", "trainer option rejected by Lightning: `num_nodes` must be a positive"),
    ("trainer.strategy=ddp_spawn", "trainer.strategy ddp_spawn trains in processes that hand nothing"),
])
def test_a_bad_trainer_option_is_refused_before_the_precision_probe(tmp_path, cache, monkeypatch,
                                                                   capfd, option, message):
    """Lightning checked these options when training built its Trainer, after auto had timed
    bf16 against fp32: the probe's wait and its line came first, then the error."""
    calls = fake_timing(monkeypatch, 1.0, 0.5)
    monkeypatch.setattr(trainer_module, "_announced", set())  # as in a new process
    files = write_corpus(tmp_path)
    args = tiny_train_args(files, tmp_path / "run", tmp_path / "data")
    assert main([*args, "trainer.precision=auto", option]) == 1
    out, err = capfd.readouterr()
    assert not calls and out == "" and err.startswith(f"error: {message}"), (out, err)
    assert len(err.splitlines()) == 1, err


def test_nodes_started_by_hand_need_node_0s_address_before_anything_runs(monkeypatch):
    """Without MASTER_ADDR and MASTER_PORT, Lightning's node 0 listened at 127.0.0.1 on a
    random port, and every node's processes waited for the others in silence (30 minutes)."""
    config = load_config("configs/transformer.yaml", ["trainer.num_nodes=2", "trainer.strategy=ddp"])
    for name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    with pytest.raises(NMTError, match=r"^trainer.num_nodes 2: set MASTER_PORT \(node 0's address and "
                       r"a free port\) and NODE_RANK \(0 to 1\) on every node"):
        trainer_module.check_device_options(config)
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert trainer_module.check_device_options(config) == 2  # 1 device x 2 nodes


@pytest.mark.parametrize("model, shapes", [
    # Sizes the config leaves out are the family's defaults (d_model 256, ff_dim 1024), not 512.
    ({"family": "transformer"}, [(512, 256, 256), (512, 256, 1024), (512, 256, 100)]),
    ({"family": "transformer", "d_model": 64, "ff_dim": 128},
     [(512, 64, 64), (512, 64, 128), (512, 64, 100)]),
    ({"family": "rnn", "rnn_type": "lstm", "emb_dim": 32, "hidden_size": 64, "attention_dim": 48},
     [(512, 64, 48), (512, 96, 256), (512, 32, 100)]),
])
def test_probe_shapes_are_the_models_own(model, shapes):
    assert precision.probe_shapes(model, vocab_size=100) == shapes


@pytest.mark.parametrize("trainer, decoding, given, bf16_time, chosen", [
    ("32-true", "auto", None, 0.5, "bf16-mixed"),  # auto measures here, whatever the run trained in
    ("bf16-mixed", "auto", None, 2.0, "32-true"),  # ... so bf16 runs decode in fp32 where bf16 is slow
    ("auto", "32-true", None, 0.5, "32-true"),  # the config's decoding.precision
    ("auto", "auto", "32-true", 0.5, "32-true"),  # --precision wins
])
def test_decoding_precision(cache, monkeypatch, trainer, decoding, given, bf16_time, chosen):
    probes = []
    monkeypatch.setattr(precision, "time_decoding", lambda model, sentences, beam, **_: probes.append(
        (sentences, beam)) or {"fp32": 1.0, "bf16": bf16_time, "steady": True})
    config = load_config("configs/transformer.yaml",
                         [f"trainer.precision={trainer}", f"decoding.precision={decoding}",
                          "data.eval_max_tokens=800", "decoding.beam_size=4"])
    choice = precision.decoding_precision(config, None, "cpu", given)
    assert choice.precision == chosen
    assert precision.autocast_dtype(choice) == (torch.bfloat16 if chosen == "bf16-mixed" else None)
    if decoding == "auto" and given is None:  # probed for a batch of eval_max_tokens
        assert probes == [(800 // precision.TYPICAL_SOURCE_PIECES, 4)]
        serving = precision.decoding_precision(config, None, "cpu", sentences=32)  # its batch
        assert probes[-1] == (32, 4) and "decoding of 32 sentences x beam 4" in serving.reason
        chunk = precision.decoding_precision(config, None, "cpu", sentences=10_000)  # translate's
        batch = 800 // precision.TYPICAL_SOURCE_PIECES  # chunk is decoded in batches of that
        assert f"decoding of {batch} sentences x beam 4" in chunk.reason and len(probes) == 2
        # another dropout is the same model to decode: the answer cached (measured again before)
        config.model["dropout"] = 0.3
        assert precision.decoding_precision(config, None, "cpu").precision == chosen
        assert len(probes) == 2
        one = precision.decoding_precision(config, None, "cpu", sentences=1)
        assert "decoding of 1 sentence x beam 4" in one.reason
    else:
        assert not probes


def test_unknown_decoding_precision_is_an_error():
    config = load_config("configs/transformer.yaml", ["decoding.precision=fp16"])
    with pytest.raises(NMTError, match="unknown decoding precision 'fp16'"):
        precision.decoding_precision(config, None, "cpu")


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_real_decoding_probe_times_both_types(family):
    """The probe runs the model's own encoder and decoding steps, beams expanded as in beam
    search, in both types."""
    model = tiny_model(family, "scaled_dot", vocab=30, seed=3).eval()
    timing = precision.time_decoding(model, sentences=3, beam=2, rounds=1)
    assert set(timing) == {"fp32", "bf16", "steady"} and timing["fp32"] > 0 and timing["bf16"] > 0


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_bf16_decoding_keeps_scores_in_fp32(family):
    """Under bf16 autocast the models still return fp32 log-probabilities, so beam scores
    add up without bf16 rounding."""
    model = tiny_model(family, "scaled_dot", vocab=30, seed=3).eval()
    b = reversal_batch(random.Random(0), 4)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        memory = model.encode(b.src, b.src_mask)
        log_probs, _, _ = model.decode_step(b.tgt_in[:, 0], model.init_state(memory), memory)
    assert log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(4))


@pytest.mark.parametrize("given,runs_in,plugin", [("bf16-mixed", "bf16-mixed", True),
                                                  ("bf16", "bf16-mixed", True),
                                                  ("32-true", "32-true", False)])
def test_mixed_precision_training_keeps_autocasts_cast_cache(tmp_path, given, runs_in, plugin):
    """Training's steps run under autocast with its cast cache on (Lightning's own plugin has
    it off), also when given by Lightning's short name; full precision stays with Lightning's
    flag. The benchmarks' Trainer takes the same precision and gradient clipping."""
    from nmt.trainer import benchmark_trainer, build_trainer

    config = load_config("configs/rnn_bahdanau.yaml",
                         [f"trainer.precision={given}", "trainer.accelerator=cpu"])
    # The benchmarks (bench train, bench data) time the steps as training runs them.
    for trainer in build_trainer(config, tmp_path), benchmark_trainer(config, 3, []):
        assert trainer.precision == runs_in
        assert trainer.gradient_clip_val == config.trainer.gradient_clip_val > 0
        assert isinstance(trainer.precision_plugin, trainer_module.CachedMixedPrecision) == plugin
        if plugin:
            with trainer.precision_plugin.forward_context():
                assert torch.is_autocast_cache_enabled()
                assert torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_the_cast_cache_keeps_every_gradient():
    """The RNN decoder reuses its weights at every position: with the cast cache each is cast
    once, so its gradient sums in bf16 before the cast back (plain torch.autocast's default),
    within a percent of summing in fp32; a no_grad forward first does not poison the cache."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    b = reversal_batch(random.Random(1), 6)

    def gradients(plugin, no_grad_first: bool = False) -> list[torch.Tensor]:
        model = tiny_model("rnn", "additive", vocab=30, seed=4).eval()  # no dropout draws
        with plugin.forward_context():
            if no_grad_first:
                with torch.no_grad():
                    model(b.src, b.src_mask, b.tgt_in)
            loss = model(b.src, b.src_mask, b.tgt_in).float().logsumexp(-1).mean()
        loss.backward()
        return [p.grad for p in model.parameters()]

    uncached = gradients(MixedPrecision("bf16-mixed", "cpu"))
    for no_grad_first in (False, True):
        cached = gradients(trainer_module.CachedMixedPrecision("bf16-mixed", "cpu"), no_grad_first)
        assert all(g is not None for g in cached)
        for c, u in zip(cached, uncached):
            assert (c - u).norm() <= 0.01 * u.norm()


class CastCounter(TorchDispatchMode):
    """Counts the dtype conversions (``aten._to_copy``) run under it."""

    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.casts += func is torch.ops.aten._to_copy.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_a_tensor_read_by_several_matmuls_is_cast_once_under_autocast(monkeypatch, family):
    """Under bf16 autocast the RNN's encoder hands bf16 annotations to the decoder (fp32
    without autocast), and the Transformer casts each attention input once for its
    projections: fewer casts, the same logits as casting at every use, and encoder
    gradients within a percent of that."""
    from nmt.models import rnn, transformer

    b = reversal_batch(random.Random(2), 6)
    attention = "additive" if family == "rnn" else "scaled_dot"

    def run() -> tuple[torch.Tensor, list[torch.Tensor], int]:
        model = tiny_model(family, attention, vocab=30, seed=5).eval()  # no dropout draws
        with torch.autocast("cpu", torch.bfloat16), CastCounter() as counter:
            logits = model(b.src, b.src_mask, b.tgt_in)
        logits.float().logsumexp(-1).mean().backward()
        return logits, [p.grad.flatten() for p in model.encoder.parameters()], counter.casts

    model = tiny_model(family, attention, vocab=30, seed=5)
    if family == "rnn":
        assert model.encode(b.src, b.src_mask)["annotations"].dtype == torch.float32
        with torch.autocast("cpu", torch.bfloat16):
            assert model.encode(b.src, b.src_mask)["annotations"].dtype == torch.bfloat16
    once, once_grads, once_casts = run()
    monkeypatch.setattr(rnn if family == "rnn" else transformer, "in_autocast_dtype", lambda x: x)
    every_use, every_use_grads, every_use_casts = run()  # cast by autocast at every matmul
    if family == "transformer":  # each self-attention input is cast once, not three times,
        # and the encoder output once, not twice per decoder layer: every cast site counts
        layers, decoder_layers = len(model.encoder) + len(model.decoder), len(model.decoder)
        assert every_use_casts - once_casts == 2 * layers + 2 * decoder_layers - 1
    else:
        assert once_casts < every_use_casts
    torch.testing.assert_close(once, every_use, rtol=0, atol=0)
    # All encoder gradients as one vector: some are zero but for rounding (a key bias
    # shifts every score of a query alike, which the softmax cancels).
    once_grads, every_use_grads = torch.cat(once_grads), torch.cat(every_use_grads)
    assert (once_grads - every_use_grads).norm() <= 0.01 * every_use_grads.norm()


def test_bf16_clips_the_gradients_of_an_optimizer_that_unscales_its_own():
    """Lightning's mixed precision refuses to clip for fused Adam, which is right under fp16's
    gradient scaler; bf16 has no scaler, and ours clips there as full precision does."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    weight = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.Adam([weight], fused=True)
    weight.grad = torch.full((4,), 10.0)
    with pytest.raises(RuntimeError, match="fused"):
        MixedPrecision("bf16-mixed", "cpu").clip_gradients(optimizer, 1.0)
    with pytest.raises(RuntimeError, match="fused"):
        trainer_module.CachedMixedPrecision("16-mixed", "cpu").clip_gradients(optimizer, 1.0)
    trainer_module.CachedMixedPrecision("bf16-mixed", "cpu").clip_gradients(optimizer, 1.0)
    torch.testing.assert_close(weight.grad.norm(), torch.tensor(1.0))


@pytest.mark.parametrize("given", ["bf16-mixed", "bf16", "32-true"])
def test_training_clips_with_fused_adam(tmp_path, given):
    """The configs clip gradients at 1.0; a run in any of these precisions trains with Adam's fused
    kernel (recorded in its checkpoint) and takes its steps."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main([*tiny_train_args(files, run, tmp_path / "data"), f"trainer.precision={given}",
                 "trainer.max_steps=2"]) == 0
    state = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["global_step"] == 2
    assert state["optimizer_states"][0]["param_groups"][0]["fused"] is True


def test_a_disturbed_decoding_probe_decides_this_run_only(cache, monkeypatch, capsys):
    """Rounds that disagree (a busy machine: bf16 2.2x fp32 in one, 0.8x in the next) choose
    for this decoding but are not cached: a noisy first translate decided every later one."""
    rounds = iter([{"fp32": [1.0, 1.0, 1.0], "bf16": [0.5, 0.45, 1.25]},  # disturbed
                   {"fp32": [1.0, 1.0, 1.0], "bf16": [0.5, 0.45, 0.5]}])  # quiet: 2.0-2.2x
    calls = []
    monkeypatch.setattr(precision, "time_decoding", lambda model, sentences, beam, **_: calls.append(
        sentences) or precision.summarise_rounds(next(rounds)))
    config = load_config("configs/transformer.yaml", ["decoding.precision=auto"])
    first = precision.decoding_precision(config, None, "cpu")
    assert first.measured and "not cached: its rounds disagreed" in first.reason
    assert "precision auto: timing bf16 decoding of" in capsys.readouterr().err
    assert not cache.exists()
    second = precision.decoding_precision(config, None, "cpu")  # measured again, steady: kept
    third = precision.decoding_precision(config, None, "cpu")
    assert len(calls) == 2 and second.precision == third.precision == "bf16-mixed"
    assert "(probe)" in second.reason and "(cached probe)" in third.reason and not third.measured


def test_stores_at_once_keep_each_others_entries(cache, monkeypatch):
    """Two processes storing at once (nmt compare --jobs 2) each read the cache, added their
    entry and renamed their file over it: the last rename dropped the other's entry. Here the
    second store comes while the first holds what it read (in a thread: flock excludes
    another open file as it does another process); it waits for the first to have written."""
    read, first_read, second_read = precision._entries, threading.Event(), threading.Event()

    def entries() -> dict:
        found = read()
        if not first_read.is_set():  # the first store's: hold it until the second has read
            first_read.set()
            second_read.wait(timeout=0.5)  # in vain where the second waits for the lock
        else:
            second_read.set()
        return found

    monkeypatch.setattr(precision, "_entries", entries)
    timing = {"fp32": 1.0, "bf16": 0.5, "steady": True}
    first = threading.Thread(target=precision._store, args=("first", timing))
    first.start()
    first_read.wait()
    precision._store("second", timing)
    first.join()
    assert json.loads(cache.read_text()) == {"first": timing, "second": timing}


def test_a_file_system_without_locks_still_caches(cache, monkeypatch):
    """flock fails on some network file systems: the answer is stored unguarded, as before
    the lock, not left out (DDP's other processes read the first one's answer there)."""
    def no_locks(file, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(precision.fcntl, "flock", no_locks)
    timing = {"fp32": 1.0, "bf16": 0.5, "steady": True}
    precision._store("key", timing)
    assert json.loads(cache.read_text()) == {"key": timing}


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path, monkeypatch):
    """A home where nothing can be written (here a file where the folder would be, which even
    root cannot write into): nothing is cached, no lock file either, and no error; the choice
    says so (it said "probe" as if cached, and the next run probed again unexplained)."""
    home = tmp_path / "home"
    home.write_text("")
    monkeypatch.setattr(precision, "CACHE", home / ".cache" / "precision.json")
    monkeypatch.setattr(precision, "has_native_bf16", lambda: True)
    assert not precision._store("key", {"fp32": 1.0, "bf16": 0.5, "steady": True})
    assert precision._entries() == {} and list(tmp_path.iterdir()) == [home]
    fake_timing(monkeypatch, 1.0, 0.5)
    choice = precision.choose_cpu_precision([(8, 8, 8)], leader=False)
    assert choice.reason.endswith(f"(probe; not cached: {precision.CACHE} cannot be written)")


def test_a_disturbed_training_probe_is_cached_for_the_other_ddp_processes(cache, monkeypatch):
    """DDP's other processes start after the first chose and read its answer from the cache:
    measuring again, each could choose another precision. The next run measures again: a
    busy machine's answer (here bf16 2.2x fp32 in one round, 0.8x in the next) was cached for
    every later run on the machine."""
    monkeypatch.setattr(precision, "time_matmuls", lambda shapes: precision.summarise_rounds(
        {"fp32": [1.0, 1.0, 1.0], "bf16": [0.5, 0.45, 1.25]}))
    first = precision.choose_cpu_precision([(8, 8, 8)])
    assert first.measured and first.reason.endswith("the machine is busy: the next run measures again)")
    monkeypatch.setattr(precision, "time_matmuls", None)  # another process would not measure
    other = precision.choose_cpu_precision([(8, 8, 8)], leader=False)
    assert not other.measured and other.precision == first.precision
    calls = fake_timing(monkeypatch, 1.0, 2.0)  # quiet now: fp32 twice as fast
    next_run = precision.choose_cpu_precision([(8, 8, 8)])
    assert calls and next_run.measured and next_run.precision == "32-true"
    assert next_run.reason.endswith("(probe)")
    assert precision.choose_cpu_precision([(8, 8, 8)]).reason.endswith("(cached probe)")


def test_decoding_precision_is_probed_at_the_beam_decoded_at(cache, monkeypatch):
    """translate --beam 1 timed auto at the config's beam 5, yet greedy and beam search can
    favour different precisions (bf16 greedy 0.57x fp32, beam 5 0.88x on one Xeon). The probe
    decodes at the beam given, each beam's answer cached apart."""
    beams = []
    monkeypatch.setattr(precision, "time_decoding", lambda model, sentences, beam, **_: beams.append(
        beam) or {"fp32": 1.0, "bf16": 0.5 if beam == 1 else 2.0, "steady": True})
    config = load_config("configs/transformer.yaml", ["decoding.precision=auto",
                                                      "decoding.beam_size=5"])
    greedy = precision.decoding_precision(config, None, "cpu", beam=1)
    assert beams == [1] and greedy.precision == "bf16-mixed" and "x beam 1 " in greedy.reason
    configured = precision.decoding_precision(config, None, "cpu")  # the config's beam: its own
    assert beams == [1, 5] and configured.precision == "32-true" and "x beam 5 " in configured.reason
    again = precision.decoding_precision(config, None, "cpu", beam=1)
    assert beams == [1, 5] and again.precision == "bf16-mixed" and not again.measured


def test_decoding_says_what_it_measured_and_only_then(cache, monkeypatch, capsys):
    monkeypatch.setattr(precision, "time_decoding", lambda model, sentences, beam, **_:
                        {"fp32": 1.0, "bf16": 0.5, "steady": True})
    config = load_config("configs/transformer.yaml", ["decoding.precision=auto"])
    precision.decoding_precision(config, None, "cpu")
    err = capsys.readouterr().err
    assert "precision auto: timing bf16 decoding of" in err
    assert "decoding precision: bf16-mixed (bf16 decoding of" in err and "2.00x fp32" in err
    precision.decoding_precision(config, None, "cpu")  # cached: nothing to wait for or say
    assert capsys.readouterr().err == ""


def a_gpu(monkeypatch, capability: tuple[int, int], name: str = "Test GPU") -> None:
    """torch sees one CUDA device of ``capability`` (none is needed: nothing runs on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: name)


@pytest.mark.parametrize("capability, chosen", [((9, 0), "bf16-mixed"), ((7, 0), "16-mixed")])
def test_training_on_a_gpu_takes_its_half_precision_from_the_hardware(monkeypatch, capability,
                                                                      chosen):
    def unused():
        raise AssertionError("a GPU's training precision is not measured")

    a_gpu(monkeypatch, capability)
    choice = precision.resolve_precision("auto", unused)
    assert choice.precision == chosen and f"Test GPU (compute {capability[0]}.0)" in choice.reason
    # training on the CPU of a machine with a GPU measures the CPU
    cpu = precision.PrecisionChoice("32-true", "the CPU's")
    assert precision.resolve_precision("auto", lambda: cpu, accelerator="cpu") == cpu


@pytest.mark.parametrize("capability, half, half_seconds, chosen", [
    ((9, 0), "bf16", 1.39, "32-true"),  # an H200's default Transformer: bf16 decoded at 0.72x
    ((9, 0), "bf16", 0.5, "bf16-mixed"),  # a model large enough for bf16 to pay
    ((7, 0), "fp16", 0.5, "16-mixed"),  # no native bf16: timed in fp16, as it trains
])
def test_decoding_on_a_gpu_is_measured_in_the_precision_it_trains_in(
        cache, monkeypatch, capability, half, half_seconds, chosen):
    """A small model's decoding step on a GPU waits on kernel launches, which autocast's casts
    add to: decoding's auto times both precisions there too, whatever the CPU has."""
    a_gpu(monkeypatch, capability)
    monkeypatch.setattr(precision, "has_native_bf16", lambda: False)  # the host CPU's: not asked
    halves = []
    monkeypatch.setattr(precision, "time_decoding", lambda model, sentences, beam, half: halves.append(
        half) or {"fp32": 1.0, half: half_seconds, "steady": True})
    config = load_config("configs/transformer.yaml", ["decoding.precision=auto"])
    choice = precision.decoding_precision(config, None, "cuda")
    assert halves == [half] and choice.precision == chosen and choice.measured
    assert f"{half} decoding of" in choice.reason and "on Test GPU (probe)" in choice.reason
    again = precision.decoding_precision(config, None, "cuda")  # cached for this GPU
    assert halves == [half] and again.precision == chosen and not again.measured
    a_gpu(monkeypatch, capability, name="Another GPU")  # another GPU measures for itself
    precision.decoding_precision(config, None, "cuda")
    assert halves == [half, half]
    # on the CPU of the same machine: the CPU's answer (no native bf16 here), no probe
    assert precision.decoding_precision(config, None, "cpu").precision == "32-true"
    assert len(halves) == 2


def test_real_decoding_probe_times_fp16_where_asked():
    model = tiny_model("transformer", "scaled_dot", vocab=30, seed=3).eval()
    timing = precision.time_decoding(model, sentences=3, beam=2, rounds=1, half="fp16")
    assert set(timing) == {"fp32", "fp16", "steady"} and timing["fp16"] > 0


def test_a_family_without_typical_matmuls_is_probed_on_its_weight_matrices(toy_registries,
                                                                             tmp_path):
    """A new family, one class and its registry entry, could not train: choosing the
    precision asked the class for ``typical_matmuls`` (an AttributeError, in every precision,
    as the shapes were read before the precision was). It is probed on its weights' shapes."""
    from .toys import toy_config

    assert precision.probe_shapes({"family": "toy", "emb_dim": 16}, vocab_size=100) == [
        (512, 16, 100), (512, 16, 128), (512, 32, 48), (512, 16, 48), (512, 32, 100)]
    config = toy_config(tmp_path, write_corpus(tmp_path))
    assert main(["train", "--config", config, "--run-dir", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "best.ckpt").is_file()
