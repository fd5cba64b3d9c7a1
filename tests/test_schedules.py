"""Learning-rate schedules as functions of the step, and dropout by the budget's epochs."""

import csv
import json
import math
import re
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Timer

from nmt.callbacks import DropoutForBudget, WarmupWithinBudget
from nmt.cli import main
from nmt.config import load_config
from nmt.config_checks import max_time
from nmt.errors import NMTError
from nmt.models import check_model_config
from nmt.schedules import budget_horizon, inverse_sqrt, steps_per_epoch, warmup_cosine
from nmt.training import train

from .conftest import tiny_model, tiny_train_args, write_corpus


def test_cosine_warms_up_then_anneals_to_the_floor_at_the_budgets_last_update():
    """A budget of 110 updates, steps 0-109 as LambdaLR counts them: the peak is update 10
    (step 9) alone, as inverse_sqrt's, and update 110 (step 109), the last, trains at the
    floor. The floor came one step late (step 110, after the budget), and the peak was held
    for two updates."""
    factor = warmup_cosine(warmup=10, horizon=lambda step: 110, floor=0.1)
    assert factor(0) == pytest.approx(0.1) and factor(9) == 1.0  # the peak
    assert factor(9) == inverse_sqrt(warmup=10)(9)
    assert factor(10) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 100)))
    assert factor(59) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway: update 60 of 10-110
    assert factor(108) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 99 / 100)))
    assert factor(109) == pytest.approx(0.1) and factor(500) == pytest.approx(0.1)
    steps = [factor(s) for s in range(9, 110)]
    assert all(a > b for a, b in zip(steps, steps[1:]))  # falls at every update after the peak


def test_cosine_without_warm_up_starts_at_the_peak_and_ends_at_the_floor():
    factor = warmup_cosine(warmup=0, horizon=lambda step: 5, floor=0.0)
    assert [round(factor(s), 6) for s in range(5)] == [1.0, 0.853553, 0.5, 0.146447, 0.0]


def test_inverse_sqrt_warms_up_linearly_then_decays_as_one_over_the_root_of_the_step():
    """Vaswani et al. eq. (3) relative to its peak at the end of warm-up: step s (from 0)
    trains at min((s + 1) / w, sqrt(w / (s + 1)))."""
    factor = inverse_sqrt(warmup=100)
    assert factor(0) == pytest.approx(0.01) and factor(49) == pytest.approx(0.5)
    assert factor(99) == pytest.approx(1.0)  # the peak
    assert factor(399) == pytest.approx(0.5) and factor(9_999) == pytest.approx(0.1)


def test_cosine_needs_a_budget():
    config = load_config("configs/transformer.yaml", ["optim.schedule=cosine",
                                                      "trainer.max_epochs=-1"])
    with pytest.raises(NMTError, match=r"schedule cosine decays to the end of the budget, and "
                                       r"none is set \(trainer.max_steps -1, trainer.max_epochs -1"):
        train(config)


def test_a_time_budget_ends_where_the_speed_so_far_reaches_it(monkeypatch):
    trainer = L.Trainer(max_steps=400, max_time="00:00:10:00", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    monkeypatch.setattr(timer, "time_elapsed", lambda stage="train": 120.0)  # 2 of 10 minutes
    horizon = budget_horizon(trainer)
    assert horizon(50) == pytest.approx(250)  # 50 steps in 2 minutes: 250 in 10
    assert horizon(100) == 400  # the step budget comes first
    untimed = L.Trainer(max_steps=400, logger=False, enable_checkpointing=False)
    assert budget_horizon(untimed)(100) == 400
    endless = L.Trainer(max_epochs=-1, max_time="00:00:10:00", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    timer = next(c for c in endless.callbacks if isinstance(c, Timer))
    monkeypatch.setattr(timer, "time_elapsed", lambda stage="train": 120.0)
    assert budget_horizon(endless)(50) == pytest.approx(250)  # no epoch limit: time alone


def test_an_epoch_ends_with_a_step_also_where_its_accumulation_is_partial():
    """Lightning steps the optimizer on an epoch's last batch: 227 batches, 2 per step, are
    114 steps (113.5 would count 10 epochs of 1,140 steps as 10.04)."""
    trainer = SimpleNamespace(num_training_batches=227, accumulate_grad_batches=2)
    assert steps_per_epoch(trainer) == 114
    assert steps_per_epoch(SimpleNamespace(num_training_batches=math.inf,
                                           accumulate_grad_batches=2)) == math.inf


@pytest.mark.parametrize("max_steps, expected", [(100_000, 400), (300, 300), (-1, 400)])
def test_steps_and_epochs_end_the_budget_whichever_comes_first(max_steps, expected):
    trainer = SimpleNamespace(callbacks=[], max_steps=max_steps, max_epochs=8,
                              num_training_batches=100, accumulate_grad_batches=2)
    assert budget_horizon(trainer)(50) == expected  # 8 epochs of 50 optimizer steps: 400


def test_cosine_over_epochs_reaches_its_floor_at_the_last_step(tmp_path):
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main([*tiny_train_args(files, run, tmp_path / "data", epochs=2),
                 "optim.schedule=cosine", "optim.warmup_steps=2", "optim.min_lr=1e-5",
                 "trainer.early_stopping_patience=10"]) == 0
    state = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(1e-5)
    # ... and the last update trained at it (the lr logged at each update is the one it took)
    rows = [row for row in csv.DictReader(open(run / "logs" / "version_0" / "metrics.csv"))
            if row.get("lr")]
    assert int(rows[-1]["step"]) == state["global_step"] - 1
    assert float(rows[-1]["lr"]) == pytest.approx(1e-5) and float(rows[-2]["lr"]) > 1e-5


def budget_trainer(monkeypatch, epoch: int, step: int, elapsed: float) -> SimpleNamespace:
    """What DropoutForBudget reads of a Trainer: 100 batches per epoch, 30 epochs at most, a
    10-minute budget of which ``elapsed`` seconds are spent, at ``step`` in ``epoch``."""
    timer = Timer(duration="00:00:10:00")
    monkeypatch.setattr(timer, "time_elapsed", lambda stage="train": elapsed)
    return SimpleNamespace(callbacks=[timer], max_steps=-1, max_epochs=30, num_training_batches=100,
                           accumulate_grad_batches=1, global_step=step, current_epoch=epoch,
                           strategy=SimpleNamespace(broadcast=lambda x: x), is_global_zero=True)


def dropout_rates(model: torch.nn.Module) -> list[float]:
    return [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]


@pytest.mark.parametrize("long_epochs, short_epochs, rule, chosen", [
    (4, None, "long run: 4 or more", 0.3),
    (12, None, "long run: 12 or more", None),
    (12, 6, "short run: under 6, long run: 12 or more", 0.0),
    (12, 5, "short run: under 5, long run: 12 or more", None),  # 5.0 epochs: not under 5
])
def test_dropout_for_budget_decides_once_after_the_first_epoch(monkeypatch, capsys, long_epochs,
                                                                short_epochs, rule, chosen):
    model = tiny_model("transformer", "scaled_dot", dropout=0.1, ff_dropout=0.05)
    module = SimpleNamespace(model=model)
    short = {} if short_epochs is None else {"short_dropout": 0.0, "short_epochs": short_epochs}
    callback = DropoutForBudget(long_dropout=0.3, long_epochs=long_epochs, **short)
    callback.on_train_epoch_start(budget_trainer(monkeypatch, 0, 0, 0.0), module)
    assert sorted(set(dropout_rates(model))) == [0.05, 0.1]  # the first epoch: as built
    # 100 steps in 2 of 10 minutes: the budget ends at step 500, epoch 5.
    callback.on_train_epoch_start(budget_trainer(monkeypatch, 1, 100, 120.0), module)
    assert f"the budget buys 5.0 epochs ({rule}): " in capsys.readouterr().out
    expected = sorted({0.05, 0.1 if chosen is None else chosen})  # feed-forward dropout keeps its own
    assert sorted(set(dropout_rates(model))) == expected
    # Decided once: a slower second epoch changes nothing, and a resume keeps the decision.
    callback.on_train_epoch_start(budget_trainer(monkeypatch, 2, 200, 590.0), module)
    resumed = DropoutForBudget(long_dropout=0.3, long_epochs=long_epochs, **short)
    resumed.load_state_dict(callback.state_dict())
    fresh = tiny_model("transformer", "scaled_dot", dropout=0.1, ff_dropout=0.05)
    resumed.on_train_epoch_start(budget_trainer(monkeypatch, 3, 300, 10.0),
                                 SimpleNamespace(model=fresh))
    assert sorted(set(dropout_rates(fresh))) == expected
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("switched, expected", [(True, [0.05, 0.3]), (False, [0.05, 0.1])])
def test_a_checkpoint_from_before_the_short_run_rule_keeps_its_decision(switched, expected):
    """Checkpoints saved before short runs had a rule hold {"decided", "switched"}: switched
    meant the long run's dropout, as it still does."""
    callback = DropoutForBudget(long_dropout=0.3, long_epochs=12, short_dropout=0.0, short_epochs=4)
    callback.load_state_dict({"decided": True, "switched": switched})
    model = tiny_model("transformer", "scaled_dot", dropout=0.1, ff_dropout=0.05)
    callback.on_train_start(None, SimpleNamespace(model=model))
    assert sorted(set(dropout_rates(model))) == expected


def test_the_rnn_sets_its_dropout_too():
    model = tiny_model("rnn", "additive", dropout=0.3)
    model.set_dropout(0.5)
    assert set(dropout_rates(model)) == {0.5}


def test_a_run_long_enough_switches_its_dropout_and_checkpoints_the_decision(tmp_path, capsys):
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main([*tiny_train_args(files, run, tmp_path / "data", epochs=3),
                 "optim.long_run_dropout=0.3", "optim.long_run_epochs=3"]) == 0
    # the long run wins where both rules would apply (the config's short run: under 3.5)
    assert "the budget buys 3.0 epochs (short run: under 3.5, long run: 3 or more): dropout 0.3 " \
        "from now on" in capsys.readouterr().out
    state = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["callbacks"]["DropoutForBudget"] == {"decided": True, "chosen": 0.3}


def test_a_short_run_switches_to_its_dropout(tmp_path, capsys):
    files = write_corpus(tmp_path)
    assert main([*tiny_train_args(files, tmp_path / "run", tmp_path / "data", epochs=3),
                 "optim.short_run_dropout=0.0", "optim.short_run_epochs=4"]) == 0
    assert "the budget buys 3.0 epochs (short run: under 4, long run: 12 or more): dropout 0.0 from now on" \
        in capsys.readouterr().out


@pytest.mark.parametrize("run", ["long_run", "short_run"])
def test_a_budget_dropout_outside_0_1_is_an_error(tmp_path, capsys, run):
    files = write_corpus(tmp_path)
    args = [*tiny_train_args(files, tmp_path / "run", tmp_path / "data"), f"optim.{run}_dropout=1.5"]
    assert main(args) != 0
    assert f"optim.{run}_dropout 1.5 needs a value in [0, 1)" in capsys.readouterr().err


@pytest.mark.parametrize("patience, epochs", [(1, 2), (0, 4)])
def test_early_stopping_waits_its_patience_and_0_trains_to_the_budget(tmp_path, patience, epochs):
    """At a learning rate of 1e-12 the translations, and so the validation BLEU, never change:
    patience 1 stops after the second validation, 0 (off) trains all 4 epochs of the budget."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main([*tiny_train_args(files, run, tmp_path / "data", epochs=4), "optim.lr=1e-12",
                 "optim.min_lr=0",  # below the rate: frozen, not a rising schedule
                 "trainer.best_metric=val_bleu", f"trainer.early_stopping_patience={patience}"]) == 0
    assert json.loads((run / "train_stats.json").read_text())["epochs"] == epochs


def test_overrides_apply_in_order_as_one_layer():
    """An item override after its list edits that list (each override a layer of its own
    could not merge the two: a traceback)."""
    config = load_config("configs/transformer.yaml", ["optim.betas=[0.8,0.9]", "optim.betas.1=0.95"])
    assert config.optim.betas == [0.8, 0.95]


def test_no_is_a_word_and_a_boolean_option_still_takes_it(tmp_path):
    """YAML 1.1 read Norwegian's language code no as False, and the corpus was prepared as
    multi30k.False-en, in a config file and in an override alike; a boolean option, typed or
    in the free-form model section, reads yes/no/on/off as before."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text("data:\n  src_lang: no\ntrainer:\n  tensorboard: yes\n")
    from_file = load_config(config_file)
    assert from_file.data.src_lang == "no" and from_file.trainer.tensorboard is True
    config = load_config("configs/transformer.yaml", ["data.tgt_lang=no", "model.pre_norm=off",
                                                      "trainer.enable_progress_bar=No"])
    assert config.data.tgt_lang == "no" and config.trainer.enable_progress_bar is False
    assert check_model_config(config.model)[1]["pre_norm"] is False
    # the model section holds the flag itself, as runs saved it before: a run started with
    # model.pre_norm=false resumes with =off (its config.yaml, and a study's keys, compare it)
    assert config.model == load_config("configs/transformer.yaml", ["model.pre_norm=false"]).model


def test_a_time_is_text_not_a_base_60_number(tmp_path):
    """YAML 1.1 read max_time: 1:30:00 as the int 5400 (refused as "got '5400'"), and
    val_check_interval=1:00:00:00 as 216000 batches; a size given so is refused, not 90."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text("trainer:\n  max_time: 1:30:00\n  max_epochs: 12\n")
    from_file = load_config(config_file)
    assert from_file.trainer.max_time == "1:30:00" and from_file.trainer.max_epochs == 12
    config = load_config("configs/transformer.yaml", ["trainer.max_time=1:30:00",
                                                      "trainer.val_check_interval=1:00:00:00"])
    assert (config.trainer.max_time, config.trainer.val_check_interval) == ("1:30:00", "1:00:00:00")
    assert max_time(config.trainer.max_time) == "00:01:30:00"
    with pytest.raises(NMTError, match="trainer.max_epochs"):
        load_config("configs/transformer.yaml", ["trainer.max_epochs=1:30"])


@pytest.mark.parametrize("given, duration, seconds", [
    ("00:30:00", "00:00:30:00", 1800),
    ("1:00:00", "00:01:00:00", 3600),  # was "00:1:00:00", which Lightning's Timer refused
    ("0:90:00", "00:01:30:00", 5400),
    ("30:00:00", "01:06:00:00", 108000),
    ("2:03:04:05", "02:03:04:05", 183845),
])
def test_max_time_takes_unpadded_and_overflowing_fields(given, duration, seconds):
    assert max_time(given) == duration
    assert Timer(duration=max_time(given))._duration == seconds


@pytest.mark.parametrize("model, message", [
    ({"family": "rnn", "hidden_size": 63}, "model.hidden_size must be even (the encoder's two "
     "directions split it), got 63"),
    ({"family": "transformer", "d_model": 63, "heads": 3}, "model.d_model must be even"),
    ({"family": "rnn", "encoder_layers": False}, "model.encoder_layers must be int, got False"),
])
def test_odd_sizes_and_booleans_for_sizes_are_refused_before_a_model_is_built(model, message):
    """An odd d_model crashed in the sinusoids with a traceback; ``heads: true`` built one head."""
    with pytest.raises(NMTError, match=re.escape(message)):
        check_model_config(model)


def test_a_family_without_the_decoding_interface_is_refused_at_start_up(toy_registries, tmp_path,
                                                                        monkeypatch, capsys):
    """A new family without set_dropout trained its first epoch and then stopped with an
    AttributeError, where the budget bought a long run (optim.long_run_dropout)."""
    from torch import nn

    from nmt import models

    from .toys import ToyFamily, toy_config

    class NoDropoutSetter(nn.Module):  # the toy family's interface but set_dropout
        __init__, forward = ToyFamily.__init__, ToyFamily.forward
        encode, init_state, decode_step = ToyFamily.encode, ToyFamily.init_state, ToyFamily.decode_step

    monkeypatch.setitem(models.MODELS, "toy", NoDropoutSetter)
    config = toy_config(tmp_path, write_corpus(tmp_path))
    assert main(["train", "--config", config, "--run-dir", str(tmp_path / "run")]) == 1
    assert capsys.readouterr().err == ("error: model family 'toy' (NoDropoutSetter) has no "
                                       "set_dropout: a family offers the decoding interface of "
                                       "nmt/models/base.py\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option, message", [
    ("trainer.early_stopping_patience=-1",
     "trainer.early_stopping_patience -1: give the validations to wait, or 0"),
    ("optim.lr=0", "optim.lr must be above 0, got 0"),
    ("optim.betas=[0.9]", "optim.betas must be two values in [0, 1), got [0.9]"),
    ("optim.schedule=inverse_sqrt optim.warmup_steps=0",
     "optim.warmup_steps must be at least 1 for schedule inverse_sqrt, got 0"),
    ("trainer.val_check_interval=0", "trainer.val_check_interval 0: give a number of batches"),
    ("trainer.val_check_interval=1.5", "trainer.val_check_interval 1.5: give a number of batches"),
    ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches must be at least 1"),
    ("trainer.strategy=bogus", "trainer option rejected by Lightning: You selected an invalid strategy"),
    ("trainer.devices=0", "trainer option rejected by Lightning: `Trainer(devices=0)`"),
    ("trainer.devices=-2", "trainer option rejected by Lightning: `devices` selected with "
     "`CPUAccelerator` should be an int > 0"),
    ("trainer.devices=abc", "trainer option rejected by Lightning: `devices` selected with "
     "`CPUAccelerator` should be an int > 0"),
    ("trainer.strategy=ddp_spawn", "trainer.strategy ddp_spawn trains in processes that hand nothing"),
    ("trainer.strategy=ddp_fork", "trainer.strategy ddp_fork trains in processes that hand nothing"),
    ("data.max_len=600", "data.max_len 600 must be below the model's max_positions 512"),
    ("model.d_model=0", "model.d_model must be at least 1, got 0"),
    ("model.heads=3", "model.heads 3 must divide model.d_model 32"),
    ("model.d_model=33 model.heads=3", "model.d_model must be even (the sinusoidal positions pair"),
    ("model.heads=true", "model.heads must be int, got True"),
    ("optim.betas=[0.9", "bad config: optim.betas=[0.9: the value is not YAML ("),  # YAML's words vary
    ("optim.betas.0=0.8", "a list option given by its items? give the whole list"),
    ("optim.betas=[0.9,0.98] optim.betas.a=1", "a list's item named by other than its number"),
    ("model.dropout=true", "model.dropout must be float, got True"),
    ("model.dropout=1.5", "model.dropout must be in [0, 1), got 1.5"),
    ("data.max_tokens=0", "data.max_tokens must be at least 1, got 0"),
    ("data.max_tokens=100", "data.max_tokens 100 cannot hold one training pair of data.max_len "
     "100 pieces (101 tokens with its end): give 101 or more, or a lower data.max_len"),
    ("data.max_len=0", "data.max_len must be at least 1, got 0"),
    ("data.train_lines=-5", "data.train_lines must be at least 1 (or null: all), got -5"),
    ("data.num_workers=-1", "data.num_workers must be 0 or more, got -1"),
    ("data.src_lang=en", "data.src_lang and data.tgt_lang are both 'en': translation needs two"),
    ("--seed -1", "seed must be from 0 to 4294967295, got -1"),
    ("decoding.beam_size=0", "decoding.beam_size must be at least 1, got 0"),
    ("decoding.max_len_ratio=-1", "decoding.max_len_ratio must be 0 or more, got -1"),
    ("optim.label_smoothing=2", "optim.label_smoothing must be in [0, 1), got 2"),
    ("trainer.max_steps=0", "trainer.max_epochs and trainer.max_steps of 0 train nothing"),
    # read as no budget, which cosine (the config's schedule) called "none is set"
    ("--max-epochs -5", "trainer.max_epochs must be 1 or more (-1: no limit), got -5"),
    ("trainer.max_steps=-2", "trainer.max_steps must be 1 or more (-1: no limit), got -2"),
    ("optim.long_run_epochs=-1", "optim.long_run_epochs must be 0 or more, got -1"),
    ("optim.short_run_dropout=0 optim.short_run_epochs=-1",
     "optim.short_run_epochs must be 0 or more, got -1"),
    ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val must be 0 (off) or more, got -1"),
    *((f"trainer.precision={p}", f"trainer.precision {p}: nmt trains fp32 weights, with bf16 or "
       "fp16 matmuls at most; choose auto, 32-true, bf16-mixed or 16-mixed")
      for p in ("bf16-true", "16-true", "64-true", "64")),  # Lightning's: a traceback at a step
])
def test_a_bad_training_option_is_a_one_line_error_before_anything_is_written(
        tmp_path, capsys, option, message):
    """Each of these failed with a traceback, some after data preparation or the first step
    and with config.yaml already written; now each is refused before data preparation."""
    files = write_corpus(tmp_path)
    assert main([*tiny_train_args(files, tmp_path / "run", tmp_path / "data"), *option.split()]) != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("config, option", [("transformer", "model.dropout=0"),
                                            ("transformer", "model.attention_dropout=0"),
                                            ("rnn_bahdanau", "model.dropout=0")])
def test_dropout_0_given_as_a_whole_number_is_valid(config, option):
    from nmt.config_checks import check_training_config

    check_training_config(load_config(f"configs/{config}.yaml", [option]))


def test_a_validation_interval_given_as_a_time_is_lightnings_to_check(tmp_path):
    """Lightning validates every DD:HH:MM:SS of training time where the interval is a time;
    only numbers are checked here."""
    from nmt.config_checks import check_training_config
    from nmt.trainer import build_trainer

    config = load_config("configs/transformer.yaml", ["trainer.val_check_interval='00:00:30:00'",
                                                      "trainer.accelerator=cpu"])
    check_training_config(config)
    assert build_trainer(config, tmp_path)._val_check_time_interval == 30 * 60  # seconds


def test_an_empty_validation_split_is_refused_before_training(tmp_path, capsys):
    """It failed with an IndexError at the end, after the whole budget had trained."""
    files = write_corpus(tmp_path)
    for path in files["val"]:
        open(path, "w").close()
    assert main(tiny_train_args(files, tmp_path / "run", tmp_path / "data")) != 0
    err = capsys.readouterr().err
    assert "the validation split is empty" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "last.ckpt").exists()


def test_an_early_stopped_run_stays_stopped_until_its_patience_is_raised(tmp_path, capsys):
    """The validation BLEU never changes (lr 1e-12): patience 1 stops after epoch 2 and says
    why; the same command again trains nothing; patience 3 given on resume trains two more
    validations (Lightning's checkpoint would restore patience 1 and stop after one)."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    args = [*tiny_train_args(files, run, tmp_path / "data", epochs=6), "optim.lr=1e-12",
            "optim.min_lr=0",  # below the rate: frozen, not a rising schedule
            "trainer.best_metric=val_bleu"]

    def epochs() -> float:
        return json.loads((run / "train_stats.json").read_text())["epochs"]

    assert main(args + ["trainer.early_stopping_patience=1"]) == 0
    assert epochs() == 2 and "early stopping ended the run: " in capsys.readouterr().out
    assert main(args + ["trainer.early_stopping_patience=1"]) == 0
    out = capsys.readouterr().out
    assert "nothing to train: at update 8 the run's val_bleu has not improved for 1 validations, " \
           "at least trainer.early_stopping_patience 1" in out and epochs() == 2
    assert main(args + ["trainer.early_stopping_patience=3"]) == 0
    assert epochs() == 4 and "early stopping ended the run: " in capsys.readouterr().out


@pytest.mark.parametrize("metric", ["val_bleu", "val_loss"])
def test_early_stopping_turned_on_at_a_resume_starts_from_the_runs_best(tmp_path, capsys, metric):
    """Trained without early stopping, then resumed with patience 1: the checkpoint held no
    early stopping, so its first validation counted as an improvement (over none) and the run
    stopped a validation late. It now starts from best.ckpt's score: the frozen run's
    unchanged score stops it at the first validation."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    args = [*tiny_train_args(files, run, tmp_path / "data", epochs=6), "optim.lr=1e-12",
            "optim.min_lr=0", f"trainer.best_metric={metric}"]
    assert main([*tiny_train_args(files, run, tmp_path / "data", epochs=2), *args[-3:],
                 "trainer.early_stopping_patience=0"]) == 0
    assert main(args + ["trainer.early_stopping_patience=1"]) == 0
    assert json.loads((run / "train_stats.json").read_text())["epochs"] == 3
    assert "early stopping ended the run: " in capsys.readouterr().out


@pytest.mark.parametrize("interval,stepped", [(3, 2), (6, 1)])
def test_the_plateau_schedule_acts_at_every_validation_of_the_cadence(tmp_path, interval, stepped):
    """2 epochs of 4 batches, validated every ``interval`` batches and at the end: the plateau
    schedule weighs the BLEU of every validation of the cadence (it was stepped at epoch ends
    alone, on the epoch's last validation, and failed where an epoch ended before the first
    validation), and not the one the end of the budget added at update 8, which an
    uninterrupted run given a larger budget later has not (test_resume.py)."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main([*tiny_train_args(files, run, tmp_path / "data", epochs=2), "optim.schedule=plateau",
                 f"trainer.val_check_interval={interval}"]) == 0
    last = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["lr_schedulers"][0]["last_epoch"] == stepped
    with open(run / "logs" / "version_0" / "metrics.csv") as f:
        bleus = [float(row["val_bleu"]) for row in csv.DictReader(f) if row["val_bleu"]]
    assert len(bleus) == stepped + 1  # and the best it weighed is the best of the cadence's
    assert last["lr_schedulers"][0]["best"] == pytest.approx(max(bleus[:stepped]), abs=1e-4)


def test_a_budget_that_ends_inside_the_warm_up_is_noted_once(monkeypatch, capsys):
    """A budget shorter than the cosine schedule's warm-up ended at a fraction of the peak
    rate, never annealed, and nothing said so. Noted at the start for a step or epoch
    budget, at the first epoch's end for a time budget; once."""
    callback = WarmupWithinBudget(warmup=400)
    callback.on_train_start(budget_trainer(monkeypatch, 0, 0, 0.0), None)  # 30 epochs: 3,000
    # 100 steps in 4 of 10 minutes: the budget ends at step 250
    callback.on_train_epoch_end(budget_trainer(monkeypatch, 0, 100, 240.0), None)
    assert capsys.readouterr().out == ("\nnote: the budget ends at update 250, inside "
                                       "optim.warmup_steps 400: the learning rate rises to 62% of "
                                       "its peak and never anneals; give a shorter warm-up for a "
                                       "budget this short\n")
    callback.on_train_epoch_end(budget_trainer(monkeypatch, 0, 100, 240.0), None)
    assert capsys.readouterr().out == ""
    fits = WarmupWithinBudget(warmup=200)  # the same budget, a warm-up within it
    fits.on_train_epoch_end(budget_trainer(monkeypatch, 0, 100, 240.0), None)
    assert capsys.readouterr().out == ""


def test_a_time_budget_spent_within_the_first_epoch_is_noted_at_the_update_reached(monkeypatch,
                                                                                  capsys):
    """The Timer ended the first epoch after 1 update in 25 minutes of a 10-minute budget
    (preparing, a slow validation): the speed so far extrapolates to update 0.4, which the
    note printed as 'update 0'."""
    WarmupWithinBudget(warmup=200).on_train_epoch_end(budget_trainer(monkeypatch, 0, 1, 1500.0),
                                                      None)
    assert "note: the budget ends at update 1, inside optim.warmup_steps 200" in \
        capsys.readouterr().out


def test_a_step_budget_inside_the_warm_up_is_noted_by_training(tmp_path, capsys):
    files = write_corpus(tmp_path)
    assert main([*tiny_train_args(files, tmp_path / "run", tmp_path / "data"),
                 "optim.schedule=cosine", "optim.warmup_steps=10", "trainer.max_steps=3"]) == 0
    assert "note: the budget ends at update 3, inside optim.warmup_steps 10" in capsys.readouterr().out
