"""Training pieces: the weight EMA's averaging window, the loss against a hand computation,
the WMT14 Transformer-base config on a tiny slice, and the Lightning messages training drops."""

from __future__ import annotations

import logging
import re
import warnings

import lightning.fabric.utilities.data
import lightning.pytorch.loggers
import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

import nmt.trainer
from nmt.callbacks import ramped_ema
from nmt.cli import main
from nmt.config import DecodingConfig, OptimConfig
from nmt.data.batching import collate
from nmt.data.tokenizer import BOS, EOS
from nmt.training import TranslationModule, epochs_trained, print_run_summary

from .conftest import REPO, tiny_train_args, write_corpus


@pytest.mark.parametrize("steps", [100, 1000, 10000])
def test_ema_spans_about_the_last_tenth_of_the_steps(steps):
    """Fed the weights w_t = t, the average lags the newest weight by a tenth of the run or
    so, whatever the run's length: it forgets the initialisation and early steps."""
    model = nn.Linear(1, 1, bias=False)
    averaged = AveragedModel(model, avg_fn=ramped_ema(0.99999))
    with torch.no_grad():
        for t in range(1, steps + 1):
            model.weight.fill_(t)
            averaged.update_parameters(model)
    lag = steps - averaged.module.weight.item()
    assert 0.05 * steps < lag < 0.2 * steps


def test_ema_decay_caps_the_window():
    model = nn.Linear(1, 1, bias=False)
    averaged = AveragedModel(model, avg_fn=ramped_ema(0.9))  # window ~10 steps
    with torch.no_grad():
        for t in range(1, 1001):
            model.weight.fill_(t)
            averaged.update_parameters(model)
    assert 5 < 1000 - averaged.module.weight.item() < 15


class NextPieceTable(nn.Module):
    """A stand-in model whose logits at a target position depend only on the input piece
    there: logits[b, t] = table[tgt_in[b, t]], shape (B, T, V)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, src, src_mask, tgt_in):
        return self.table[tgt_in]


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_is_the_mean_over_real_target_pieces(smoothing):
    """Each target piece (and EOS) is predicted from the piece before it (BOS first); padding
    counts for nothing. A shifted target or counted padding would give another number."""
    targets = [[5, 6, 7, 8], [9], [10, 11]]  # different lengths: the batch holds padding
    batch = collate([(i, [4, 4], t) for i, t in enumerate(targets)])
    model = NextPieceTable(vocab=12)
    module = TranslationModule(model, None, OptimConfig(), DecodingConfig(), [], seed=0)
    loss, tokens = module._loss(batch, smoothing)
    terms = []
    for target in targets:
        for previous, wanted in zip([BOS] + target, target + [EOS]):
            log_p = torch.log_softmax(model.table[previous], dim=-1)
            terms.append((1 - smoothing) * -log_p[wanted] + smoothing * -log_p.mean())
    assert tokens == sum(len(t) + 1 for t in targets) == len(terms)
    torch.testing.assert_close(loss, torch.stack(terms).mean())


def test_wmt14_base_config_trains_on_a_tiny_slice(tmp_path, capsys):
    """configs/wmt14_ende_transformer_base.yaml, its sizes overridden down, on one CPU process:
    every key is valid, the effective batch and the model's size are printed (Lightning's
    summary, with its FLOPs of 0, is not) and two steps train and checkpoint."""
    files = write_corpus(tmp_path)
    args = [
        "train", "--config", str(REPO / "configs" / "wmt14_ende_transformer_base.yaml"),
        "--run-dir", str(tmp_path / "run"), "data.hub_dataset=null",
        f"data.train_files=[{','.join(files['train'])}]",
        f"data.val_files=[{','.join(files['val'])}]", f"data.data_dir={tmp_path / 'data'}",
        "data.vocab_size=100", "data.spm_sample=200", "data.max_tokens=600", "data.num_workers=1",
        "model.d_model=32", "model.heads=2", "model.ff_dim=64", "model.encoder_layers=1",
        "model.decoder_layers=1", "trainer.accelerator=cpu", "trainer.devices=1",
        "trainer.strategy=auto", "trainer.max_steps=2",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "effective batch: 1 processes (1 devices x 1 nodes) x 600 tokens" in out
    last = torch.load(tmp_path / "run" / "last.ckpt", map_location="cpu", weights_only=False)
    count = sum(weights.numel() for weights in last["state_dict"].values())
    assert f"model: TransformerModel, {count:,} parameters (" in out
    assert "Total Flops" not in out and "Total params" not in out
    assert re.search(r"trained 2 updates \([\d.]+ epochs?\) at ", out), out
    assert "; last validation: val_bleu " in out
    assert last["global_step"] == 2 and (tmp_path / "run" / "best.ckpt").is_file()


@pytest.mark.parametrize("silenced", [True, False])
def test_training_passes_on_none_of_lightnings_noise(tmp_path, monkeypatch, silenced):
    """On a host with more than 2 cores Lightning advises DataLoader workers (batches here take
    0.07 ms to build); it warns that the run directory is not empty (it holds the config), and
    at every epoch that there are fewer
    batches than log_every_n_steps (printed twice; the loss is logged every N updates across
    epochs); torch warns about Lightning's use of LeafSpec; and every Trainer prints a tip to
    install a cloud logger. Training passes none of them on; without the filters each reaches
    the user."""
    monkeypatch.setattr(lightning.fabric.utilities.data, "_num_cpus_available", lambda: 16)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    monkeypatch.setattr(rank_zero, "filters", [])  # as in a fresh process
    if not silenced:
        monkeypatch.setattr(nmt.trainer, "quiet_lightning_noise", lambda: None)
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    rank_zero.addHandler(handler)
    files = write_corpus(tmp_path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main([*tiny_train_args(files, tmp_path / "run", tmp_path / "data"),
                         "--trainer.log_every_n_steps", "50"]) == 0
    finally:
        rank_zero.removeHandler(handler)
    warned = " ".join(str(w.message) for w in caught)
    heard = [text in warned for text in ("`num_workers` argument", "Checkpoint directory",
                                         "smaller than the logging interval", "LeafSpec")]
    heard.append(any(m.startswith("💡 Tip") for m in logged))
    # The last two come with the versions installed here (torch 2.13 deprecated LeafSpec,
    # Lightning 2.6 added the tip); the control expects them only where they exist.
    leaf_spec = getattr(torch.utils._pytree, "LeafSpec", None)
    emitted = [True, True, True, hasattr(leaf_spec, "__deprecated__"),
               hasattr(lightning.pytorch.loggers, "LitLogger")]
    assert heard == [not silenced and exists for exists in emitted]
    assert any(m.startswith("GPU available") for m in logged)  # Lightning's other news stays


def test_a_corpus_not_found_is_said_before_the_trainer_is_built(tmp_path, monkeypatch, capsys):
    """No local files and the Hub unreachable: the one-line error came after the precision
    probe's lines and Lightning's ("GPU available: False ..."), from building the Trainer."""
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path / "hf_cache")  # no copy
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub_cache"))

    def build_trainer(*args):
        raise AssertionError("the Trainer was built before the corpus was found")

    monkeypatch.setattr("nmt.training.build_trainer", build_trainer)
    assert main(["train", "--run-dir", str(tmp_path / "run"), f"data.data_dir={tmp_path}"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: corpus 'multi30k' (de-en) not found locally in ")
    assert "bentrevett/multi30k" in error and error.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("given", ["yaml", "override"])
def test_an_empty_run_dir_is_refused_as_on_the_command_line(tmp_path, monkeypatch, capsys, given):
    """--run-dir "" is refused (an unset variable), but run_dir: "" in a config file (or the
    override run_dir="" with its quotes) read as unset: the run trained into the default folder under
    checkpoints/, silently. It is now the one-line error of a bad config."""
    monkeypatch.chdir(tmp_path)
    args = [arg for arg in tiny_train_args(write_corpus(tmp_path), tmp_path / "run", tmp_path / "data")
            if arg not in ("--run-dir", str(tmp_path / "run"))]
    if given == "yaml":
        config = REPO / "configs" / "transformer.yaml"
        (tmp_path / "run.yaml").write_text(config.read_text(encoding="utf-8") + '\nrun_dir: ""\n',
                                           encoding="utf-8")
        args[args.index(str(config))] = str(tmp_path / "run.yaml")
    else:  # the quotes kept (a script's argument list): YAML's empty text; run_dir= is null
        args.append('run_dir=""')
    assert main(args) == 1
    assert capsys.readouterr().err == ("error: bad config: run_dir is empty (an unset variable?): "
                                       "name a folder, or leave it out (null) for the default "
                                       "under checkpoints/\n")
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("key", ["data_dir", "hub_dataset", "corpus", "src_lang"])
def test_an_empty_data_option_is_refused(tmp_path, monkeypatch, capsys, key):
    """data.data_dir: "" prepared the corpus into ./prepared, data.hub_dataset: "" read as
    no Hub dataset (the local files, or Multi30k's), silently, as run_dir: "" once did."""
    monkeypatch.chdir(tmp_path)
    args = tiny_train_args(write_corpus(tmp_path), tmp_path / "run", tmp_path / "data")
    assert main([*args, f'data.{key}=""']) == 1
    assert capsys.readouterr().err == (f"error: bad config: data.{key} is empty (an unset "
                                       "variable?): give it a value, or leave it out for the default\n")
    assert not (tmp_path / "run").exists() and not (tmp_path / "prepared").exists()


def test_a_run_resumed_without_early_stopping_or_kept_checkpoints_says_nothing_of_them(tmp_path):
    """Turning early stopping and checkpoint keeping off between segments is allowed
    (RESUMABLE_CHANGES); Lightning still asked the user to add those callbacks back."""
    files = write_corpus(tmp_path)
    args = tiny_train_args(files, tmp_path / "run", tmp_path / "data", epochs=1)
    assert main(args) == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*tiny_train_args(files, tmp_path / "run", tmp_path / "data"),
                     "trainer.early_stopping_patience=0", "trainer.keep_last_checkpoints=0"]) == 0
    assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)]


@pytest.mark.parametrize("steps, epochs, said", [(1, 1.0, "trained 1 update (1 epoch) at 2,500 tgt tok/s"),
                                                 (3, 0.5, "trained 3 updates (0.5 epochs) at"),
                                                 (1200, 2.0, "trained 1,200 updates (2 epochs) at")])
def test_the_run_summary_counts_in_words(capsys, steps, epochs, said):
    """A short run said "trained 3 updates (1 epochs)"."""
    print_run_summary({"steps": steps, "epochs": epochs, "tgt_tok_per_s": 2500.0},
                      {"val_bleu": torch.tensor(1.0)}, None)
    assert capsys.readouterr().out.startswith(said)


@pytest.mark.parametrize("steps, per_epoch, epochs", [(30, 20159, 0.0015), (1, 3, 0.33), (5, 4, 1.25),
                                                      (2999, 1000, 3.0), (0, 10, 0.0)])
def test_epochs_trained_keep_a_short_run_of_a_large_corpus_above_0(steps, per_epoch, epochs):
    """30 updates of a 2.5M-pair corpus said "trained 30 updates (0 epochs)", and
    train_stats.json "epochs": 0.0."""
    assert epochs_trained(steps, per_epoch) == epochs
