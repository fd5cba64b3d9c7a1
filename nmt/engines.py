"""Which inference engine runs a model: our PyTorch ``Translator`` (``nmt.translator``) or
CTranslate2 (``nmt.ctranslate2_translator.CTranslate2Translator``).

Both offer ``translate(lines, beam_size, nbest, alpha, need_attn, first_line, warn)``,
``encode_lines``, ``tokenizer``, ``config``, ``max_positions`` (serve cuts lines to it) and
``device`` (evaluate records it), so ``translate``, ``evaluate``, ``serve`` and ``bench decode``
take either.
"""

from __future__ import annotations

from collections.abc import Sequence

from nmt.errors import NMTError

ENGINES = ("torch", "ctranslate2")
DEVICE_TYPES = ("cpu", "cuda")


def decoding_device(device: str | None, cuda_devices: int | None = None) -> str:
    """``device`` (cpu, cuda or cuda:N) checked against the CUDA devices the engine sees
    (``cuda_devices``; default: torch's); None: cuda where there is one, else cpu."""
    import torch

    if cuda_devices is None:
        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device is None:
        return "cuda" if cuda_devices else "cpu"
    try:
        kind = torch.device(device)
    except (RuntimeError, ValueError):
        kind = None
    if kind is None or kind.type not in DEVICE_TYPES:
        raise NMTError(f"unknown device '{device}'; choose cpu, cuda or cuda:N")
    if kind.type == "cpu":
        return "cpu"  # one device, whatever number is given
    if not cuda_devices:  # cuda or cuda:N from here on
        raise NMTError(f"device {device} asked for, but no CUDA device is available")
    if (kind.index or 0) >= cuda_devices:
        raise NMTError(f"device {device} asked for, but there are {cuda_devices} CUDA "
                       "device(s), numbered from 0")
    return device


def check_engine_options(engine: str, weights: str | None, precision: str | None,
                         ensemble: Sequence[str] = ()) -> None:
    """A known engine. ``weights`` and ``precision`` choose among a torch run's checkpoints and
    decoding precisions, ``ensemble`` adds runs to decode with; an exported model has fixed
    weights and its own quantization, and decodes alone."""
    if engine not in ENGINES:
        raise NMTError(f"unknown engine '{engine}'; choose one of: {', '.join(ENGINES)}")
    if engine == "torch":
        return
    if weights is not None:
        raise NMTError("--weights is for the torch engine; export those weights instead "
                       "(nmt export --weights)")
    if precision is not None:
        raise NMTError("--precision is for the torch engine; export with --quantization instead")
    if ensemble:
        raise NMTError("--ensemble is for the torch engine")


def load_translator(path: str, engine: str = "torch", device: str | None = None,
                    weights: str | None = None, precision: str | None = None,
                    sentences: int | None = None, beam: int | None = None,
                    ensemble: Sequence[str] = ()):
    """The ``engine``'s translator of ``path``: for torch a run directory (and optionally
    another checkpoint file of it, a decoding precision, how many sentences are decoded
    together and at what beam, for ``auto``, and more runs to decode with as an ensemble);
    for ctranslate2 a directory written by ``nmt export``, decoded on ``device`` alone (the
    other options are torch's: ``check_engine_options`` refuses them)."""
    check_engine_options(engine, weights, precision, ensemble)
    if engine == "torch":
        from nmt.translator import Translator

        return Translator.from_run_dir(path, device, weights, precision, sentences, beam, ensemble)
    try:  # ctranslate2
        from nmt.ctranslate2_translator import CTranslate2Translator
    except ImportError:
        raise NMTError('the ctranslate2 engine needs CTranslate2: pip install -e ".[export]"') from None
    return CTranslate2Translator(path, device)
