"""Model families by name. A new family: one class with the ``Seq2Seq`` interface + one entry
in ``MODELS`` (what else it may offer: README, "Adding a scorer or a model family")."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nmt.attention import SCORERS
from nmt.errors import NMTError
from nmt.models.base import model_option
from nmt.models.rnn import RNNModel
from nmt.models.transformer import TransformerModel

MODELS: dict[str, type[nn.Module]] = {"rnn": RNNModel, "transformer": TransformerModel}

# What search, training and the ensemble call on every family (``nmt.models.base``), checked
# by name at start-up: a family without set_dropout would stop a run after its first epoch.
INTERFACE = ("encode", "init_state", "decode_step", "set_dropout")

# Size options that must be even, and why.
EVEN_OPTIONS = {"d_model": "the sinusoidal positions pair a sine with a cosine",
                "hidden_size": "the encoder's two directions split it"}


def check_model_config(model_cfg: dict[str, Any]) -> tuple[type[nn.Module], dict[str, Any]]:
    """The family's class and its keyword arguments, after checking names and types.

    Unknown families, scorers and arguments, families without the decoding interface, and
    mistyped values fail here, at start-up.
    """
    kwargs = dict(model_cfg)
    family = kwargs.pop("family", None)
    if family not in MODELS:
        raise NMTError(f"unknown model family '{family}'; choose one of: {', '.join(MODELS)}")
    if kwargs.get("attention", next(iter(SCORERS))) not in SCORERS:
        raise NMTError(f"unknown attention '{kwargs['attention']}'; "
                       f"choose one of: {', '.join(SCORERS)}")
    cls = MODELS[family]
    if missing := [name for name in INTERFACE if not callable(getattr(cls, name, None))]:
        raise NMTError(f"model family '{family}' ({cls.__name__}) has no {', '.join(missing)}: "
                       "a family offers the decoding interface of nmt/models/base.py")
    params = inspect.signature(cls).parameters
    valid = [name for name in params if name != "vocab_size"]
    for key, value in kwargs.items():
        if key not in valid:
            raise NMTError(f"unknown model option '{key}' for {family}; valid: {', '.join(valid)}")
        expected = type(params[key].default)
        # isinstance(True, int) holds, so a boolean would pass for a size ("heads: true" -> 1).
        wrong_type = not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool)
        if wrong_type and not (expected is float and type(value) is int):
            raise NMTError(f"model.{key} must be {expected.__name__}, got {value!r}")
        check_model_value(key, value, expected)
    for key, why in EVEN_OPTIONS.items():
        if key in params and model_option(cls, kwargs, key) % 2:
            raise NMTError(f"model.{key} must be even ({why}), got {model_option(cls, kwargs, key)}")
    if "heads" in params and model_option(cls, kwargs, "d_model") % model_option(cls, kwargs, "heads"):
        raise NMTError(f"model.heads {model_option(cls, kwargs, 'heads')} must divide model.d_model "
                       f"{model_option(cls, kwargs, 'd_model')}")
    return cls, kwargs


def check_model_value(key: str, value: Any, expected: type) -> None:
    """Sizes and counts (the options whose default is an int) are at least 1; dropout
    probabilities lie in [0, 1) (``dropout: 0`` is a float option given as an int)."""
    if "dropout" in key and not 0 <= value < 1:
        raise NMTError(f"model.{key} must be in [0, 1), got {value}")
    if expected is int and value < 1:
        raise NMTError(f"model.{key} must be at least 1, got {value}")


def scorer_of(model_cfg: dict[str, Any]) -> str:
    """The attention scorer a model section trains: model.attention, or its family's default
    where the section leaves it out (a config may name the default or not: the same model)."""
    cls, kwargs = check_model_config(model_cfg)
    return model_option(cls, kwargs, "attention")


def build_model(model_cfg: dict[str, Any], vocab_size: int) -> nn.Module:
    """Build the model of a config section ``{family: ..., <constructor arguments>}``."""
    cls, kwargs = check_model_config(model_cfg)
    return cls(vocab_size=vocab_size, **kwargs)


class _SkipNormalFill(TorchFunctionMode):
    """``nn.init.normal_`` and ``Tensor.normal_`` as no-ops (both: a mode does not see the calls
    made inside a function it passes on). On the meta device there are no values to fill, and torch
    decomposes ``normal_`` there in Python behind ``torch._dynamo.disable``, whose first call
    imports torch._dynamo: 2 s of a server's start on a slow CPU for a fill of nothing. The
    other fills (uniform_, zero_, ...) have meta kernels and cost nothing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (nn.init.normal_, torch.Tensor.normal_):
            return args[0] if args else kwargs["tensor"]  # the tensor, as they return it
        return func(*args, **(kwargs or {}))


def build_shape_model(model_cfg: dict[str, Any], vocab_size: int) -> nn.Module:
    """``build_model`` on the meta device: the modules and their shapes, with no memory and no
    initialisation, in milliseconds (to read what a family is built of, or to check weights
    against it)."""
    with torch.device("meta"), _SkipNormalFill():
        return build_model(model_cfg, vocab_size)
