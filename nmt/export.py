"""Export a Transformer run to CTranslate2 (``nmt export``).

``RunConverter`` is a CTranslate2 ``Converter``: it fills a ``TransformerSpec`` with our
weights. What has to match our ``TransformerModel`` exactly:

* pre-norm (or post-norm) residual blocks, and the final layer norm of each pre-norm stack;
* our sinusoidal table, passed as it is: CTranslate2's own table puts the sines and cosines
  in two halves, ours interleaves them (``models.transformer.sinusoids``);
* embeddings scaled by sqrt(D) before the positions are added (section 3.4);
* one embedding matrix for source, target and output layer (CTranslate2 stores it once);
* torch's LayerNorm epsilon (1e-5) and its separate q, k, v projections, fused here the way
  CTranslate2 expects them (q|k|v for self-attention, k|v for cross-attention).

The exported model is decoded by ``nmt.ctranslate2_translator``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from contextlib import suppress
from pathlib import Path

import ctranslate2
import numpy as np
import torch
from ctranslate2.specs import TransformerSpec
from torch import nn

from nmt.config import Config, run_config
from nmt.errors import NMTError
from nmt.files import is_export, made_folders_removed_on_failure, refuse_export
from nmt.models.transformer import TransformerModel
from nmt.translator import Translator

QUANTIZATIONS = ("float32", "int8")
BESIDE_THE_MODEL = ("spm.model", "config.yaml")  # what our side needs: pieces and options
SOURCE = "source.json"  # the checkpoint exported, as it was then (``export_source``)
# What an export folder holds: CTranslate2's files (its vocabulary as .json or .txt, by version)
# and ours.
EXPORT_FILES = {"model.bin", "config.json", "shared_vocabulary.json", "shared_vocabulary.txt",
                *BESIDE_THE_MODEL, SOURCE}


def check_exportable(config: Config) -> None:
    """One-line ``NMTError`` for runs CTranslate2 has no implementation of."""
    family = config.model.get("family")
    attention = config.model.get("attention", "scaled_dot")
    if family != "transformer":
        raise NMTError(f"CTranslate2 cannot run a '{family}' model: nmt export converts the "
                       "transformer family alone (CTranslate2 implements Transformers only)")
    if attention != "scaled_dot":
        raise NMTError(f"CTranslate2 cannot run '{attention}' attention: its Transformer "
                       "computes scaled dot-product attention only (train with scaled_dot)")


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().float().numpy()


def _set_linear(spec, *layers: nn.Linear) -> None:
    """One CTranslate2 linear from one or several of ours, stacked along the outputs."""
    spec.weight = np.concatenate([_array(layer.weight) for layer in layers])
    spec.bias = np.concatenate([_array(layer.bias) for layer in layers])


def _set_norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _set_attention(spec, attention, norm: nn.LayerNorm, self_attention: bool) -> None:
    """q|k|v fused for self-attention; q and k|v for cross-attention; then the output."""
    if self_attention:
        _set_linear(spec.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
    else:
        _set_linear(spec.linear[0], attention.q_proj)
        _set_linear(spec.linear[1], attention.k_proj, attention.v_proj)
    _set_linear(spec.linear[-1], attention.out_proj)
    _set_norm(spec.layer_norm, norm)


def _set_ffn(spec, layer) -> None:
    _set_linear(spec.linear_0, layer.ff[0])
    _set_linear(spec.linear_1, layer.ff[3])  # ff = Linear, ReLU, Dropout, Linear
    _set_norm(spec.layer_norm, layer.res_ff.norm)


def _set_inputs(spec, model: TransformerModel, embeddings) -> None:
    """Shared embedding matrix, scaled by sqrt(D), plus our own position table."""
    embeddings.weight = _array(model.embed.weight)
    spec.scale_embeddings = True
    spec.position_encodings.encodings = _array(model.positions)


class RunConverter(ctranslate2.converters.Converter):
    """Our Transformer (a loaded ``Translator``) -> ``TransformerSpec``."""

    def __init__(self, translator: Translator):
        self.model, self.tokenizer = translator.model, translator.tokenizer

    def _load(self) -> TransformerSpec:
        model = self.model
        heads = model.encoder[0].self_attn.heads
        pre_norm = model.encoder[0].res_attn.pre_norm
        # Attention returned by CTranslate2: the mean over all heads of the last layer, as ours.
        spec = TransformerSpec.from_config((len(model.encoder), len(model.decoder)), heads,
                                           pre_norm=pre_norm, alignment_layer=-1,
                                           alignment_heads=heads)
        spec.config.layer_norm_epsilon = model.encoder[0].res_attn.norm.eps
        _set_inputs(spec.encoder, model, spec.encoder.embeddings[0])
        _set_inputs(spec.decoder, model, spec.decoder.embeddings)
        spec.decoder.projection.weight = _array(model.embed.weight)  # tied output layer, no bias
        for layer, layer_spec in zip(model.encoder, spec.encoder.layer):
            _set_attention(layer_spec.self_attention, layer.self_attn, layer.res_attn.norm, True)
            _set_ffn(layer_spec.ffn, layer)
        for layer, layer_spec in zip(model.decoder, spec.decoder.layer):
            _set_attention(layer_spec.self_attention, layer.self_attn, layer.res_self.norm, True)
            _set_attention(layer_spec.attention, layer.cross_attn, layer.res_cross.norm, False)
            _set_ffn(layer_spec.ffn, layer)
        if pre_norm:
            _set_norm(spec.encoder.layer_norm, model.enc_norm)
            _set_norm(spec.decoder.layer_norm, model.dec_norm)
        vocabulary = self.tokenizer.pieces(list(range(len(self.tokenizer))))
        spec.register_source_vocabulary(vocabulary)
        spec.register_target_vocabulary(vocabulary)
        return spec


def export_ctranslate2(run_dir: str | Path, out: str | Path, quantization: str = "float32",
                       weights: str | None = None) -> Path:
    """Convert ``run_dir`` into a CTranslate2 model in ``out``, with our SentencePiece model
    and config beside it (all ``nmt translate --engine ctranslate2`` needs). ``weights``: a
    checkpoint file of the run, as translate's (default: the run's final weights)."""
    run_dir, out = Path(run_dir), Path(out)
    if quantization not in QUANTIZATIONS:
        raise NMTError(f"unknown quantization '{quantization}'; choose one of: {', '.join(QUANTIZATIONS)}")
    refuse_export(run_dir, "nmt export takes the training run it came from")
    check_exportable(run_config(run_dir))
    check_export_target(out)
    # fp32 as stored: nothing is decoded, so auto's timing probe would only cost seconds
    translator = Translator.from_run_dir(run_dir, "cpu", weights, precision="32-true")
    beside = run_files(run_dir)
    source = export_source(run_dir, translator.checkpoint, weights)
    # Written beside ``out`` and swapped in whole: a failed export (a full disk, Ctrl-C)
    # leaves an earlier export in ``out`` as it was.
    target = out.resolve()  # "../ct2" made whole, to put the new one beside
    new, old = (target.with_name(f".{target.name}.{what}{os.getpid()}") for what in ("new", "old"))
    with made_folders_removed_on_failure(target):  # CTranslate2 makes those above ``new``
        try:
            RunConverter(translator).convert(str(new), quantization=quantization, force=True)
            for name, (content, mode) in beside.items():
                (new / name).write_bytes(content)
                (new / name).chmod(mode)  # a private run file stays private in the export
            (new / SOURCE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
            if target.exists():  # replaced: its permissions kept (a private folder stays so)
                shutil.copymode(target, new)
                target.rename(old)
            new.rename(target)
        except OSError as err:  # named as --out: the hidden folder beside it, which it named, is gone
            raise NMTError(f"cannot write {out}: {err.strerror or err}") from None
        finally:
            if old.exists() and not target.exists():  # stopped between the two renames
                old.rename(target)
            for folder in (new, old):
                shutil.rmtree(folder, ignore_errors=True)
    return out


def export_source(run_dir: Path, checkpoint: Path, weights: str | None) -> dict:
    """What an export records of where it came from (``SOURCE``): the run, the checkpoint file
    and its modification time (training writes the file anew as the run trains on), and
    whether that file was the run's own choice (no --weights), which later training may move
    to another file (its average)."""
    return {"run": str(run_dir.resolve()), "checkpoint": str(checkpoint.resolve()),
            "modified_ns": checkpoint.stat().st_mtime_ns, "run_choice": weights is None}


def run_files(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """The run's files an export carries beside the model (``BESIDE_THE_MODEL``), each with its
    permission bits, read before anything is written: a file that cannot be read is named,
    where its copy's error was reported as one writing --out."""
    files = {}
    for name in BESIDE_THE_MODEL:
        try:
            files[name] = ((run_dir / name).read_bytes(),
                           stat.S_IMODE((run_dir / name).stat().st_mode))
        except OSError as err:
            raise NMTError(f"cannot read {run_dir / name}: {err.strerror or err}") from None
    return files


def check_export_target(out: Path) -> None:
    """A new export replaces the output folder whole: ``out`` must be new, or an earlier
    export holding nothing else (an evaluation's eval/, say, would be lost) that is not the
    folder the command runs in."""
    if out.is_symlink():  # a link to a folder would be replaced by the folder
        raise NMTError(f"--out {out} is a symbolic link: name the folder itself")
    if not out.exists():
        return
    if not is_export(out):
        raise NMTError(f"{out} exists and is not a CTranslate2 export: choose a new --out")
    others = sorted(p.name for p in out.iterdir() if p.name not in EXPORT_FILES)
    if others:
        raise NMTError(f"{out} holds files nmt export did not write ({', '.join(others)}), which "
                       "the new export would delete: move them, or choose a new --out")
    with suppress(FileNotFoundError):  # where the current folder was removed, it is not out
        if os.path.samefile(out, os.curdir):  # a shell cannot be moved into the new one
            raise NMTError(f"--out {out} is the folder this command runs in, which the export "
                           "would replace, leaving your shell in a removed folder: run it from "
                           "outside (cd ..)")

