"""The models a server serves: their names, their directories checked, and what /info says
of each (read from their configs, without loading weights)."""

import functools
import os
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from nmt.attention_stats import attention_layout
from nmt.config import load_config, refuse_checkpoint_file
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NMTError
from nmt.files import is_export
from nmt.models import build_shape_model, scorer_of


def model_info(name: str, path: str, engine: str, ensemble: Sequence[str] = ()) -> dict:
    """What /info says about a served model, read from its configs without loading weights.
    An ensemble's family is "ensemble" and its attention null (its runs may differ in both:
    the first run's alone would misname it); ``members`` gives each run's, the first one
    included, and the parameters are all runs' together."""
    members = [run_summary(name, path),
               *(run_summary(model_name(member), member) for member in ensemble)]
    info = {**members[0], "parameters": sum(map(parameter_count, [path, *ensemble])),
            "engine": engine}
    if ensemble:
        info.update(family="ensemble", attention=None, attention_layers=None, attention_heads=None,
                    members=members)
    else:
        info["attention_layers"], info["attention_heads"] = attention_maps(path, engine)
    return info


def attention_maps(path: str, engine: str) -> tuple[int, int]:
    """(layers, heads) of the cross-attention maps a served model's answers read, which a
    request's "attention_layer" and "attention_head" pick from: the torch engine's from the
    model its config builds (``run_shape``), (1, 1) for an RNN's one map and for CTranslate2's
    (the last layer's mean over heads)."""
    return attention_layout(run_shape(path) if engine == "torch" else None, "cross")


def run_summary(name: str, path: str) -> dict:
    """A run's name, family, attention and languages, from its config.yaml."""
    config = load_config(Path(path) / "config.yaml")
    return {"name": name, "family": config.model["family"], "attention": scorer_of(config.model),
            "src_lang": config.data.src_lang, "tgt_lang": config.data.tgt_lang}


def parameter_count(run_dir: str) -> int:
    """The parameters of a run's model, counted from its config and vocabulary."""
    return sum(p.numel() for p in run_shape(run_dir).parameters())


@functools.cache
def run_shape(run_dir: str) -> nn.Module:
    """A run's model on the meta device (``build_shape_model``), from its config and vocabulary:
    built once for /info and the API's layer checks. Read, never changed (a weights check,
    which assigns its tensors, builds its own)."""
    config = load_config(Path(run_dir) / "config.yaml")
    return build_shape_model(config.model, len(Tokenizer(Path(run_dir) / "spm.model")))


def model_name(path: str | Path) -> str:
    """The name a served directory goes by: its own as given, "." and ".." read as the folders
    they name. A link keeps its name, not its target's: clients that ask for the model
    "current" (a link to the latest run) got a 400 unknown model once it pointed elsewhere."""
    return Path(os.path.abspath(path)).name


def served_models(paths: list[str], engine: str) -> dict[str, str]:
    """Model name (the directory's name) -> path; each checked before any worker starts."""
    runs: dict[str, str] = {}
    for path in paths:
        name = model_name(path)
        if name in runs:
            raise NMTError(f"two directories named '{name}': model names must differ")
        refuse_checkpoint_file(path)  # RUN/best.ckpt: the run and --weights, as translate says
        if not (Path(path) / "config.yaml").is_file() or not (Path(path) / "spm.model").is_file():
            what = "an exported model" if engine == "ctranslate2" else "a training run"
            raise NMTError(f"{path} is not {what} directory (no config.yaml and spm.model)")
        if engine == "ctranslate2" and not is_export(path):
            raise NMTError(f"no CTranslate2 model in {path}: serve a folder written by nmt export "
                           "(of a Transformer run), or serve the run with --engine torch")
        runs[name] = path
    return runs
