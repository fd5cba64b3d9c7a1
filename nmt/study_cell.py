"""One finished study cell -> its record: what the tables and pictures are rebuilt from.

``<out>/cells/<cell>/record.json`` holds the cell's identity and resolved configuration,
its test scores (beam search, sacreBLEU) and the checkpoint file they came from, its training
totals, where and in what precision it was trained, the attention statistics of a
teacher-forced pass over the test set (``nmt.attention_stats``), and the attention matrices of
the plotted test sentences; ``hyps.txt`` holds its test translations (for paired significance
tests). No weights.
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from nmt.attention_stats import attention_key_size, attention_statistics, teacher_forced_weights
from nmt.data.batching import PairDataset, decoding_loader
from nmt.data.corpus import test_set_name
from nmt.data.prepare import lines_sha1
from nmt.errors import NMTError
from nmt.evaluate import best_translations, split_pairs
from nmt.files import write_atomic
from nmt.metrics import lowercase_bleu, score_corpus
from nmt.provenance import code_commit, device_name
from nmt.translator import Translator

RECORD = "record.json"
HYPOTHESES = "hyps.txt"
# What every record holds (``finish_cell``), that the tables and figures read: fields and types,
# and within some of them the keys read.
RECORD_FIELDS = {"cell": dict, "key": str, "config": dict, "scores": dict, "train": dict,
                 "provenance": dict, "attention_stats": dict, "pictures": list,
                 "decode_sent_per_s": (int, float)}
RECORD_KEYS = {"config": ("model",), "scores": ("bleu", "chrf", "sentences"),
               "train": ("parameters", "steps"), "provenance": ("precision", "code", "device")}
# Of those, the values read as numbers, text or sections, and their types
RECORD_VALUES = {("scores", "bleu"): (int, float), ("scores", "chrf"): (int, float),
                 ("scores", "sentences"): int, ("scores", "bleu_signature"): str,
                 ("config", "model"): dict, ("train", "parameters"): int, ("train", "steps"): int}
PICTURE_KEYS = {"line", "cross", "source", "target"}  # what the figures draw from a picture


def read_record(folder: Path) -> dict | None:
    """The cell's record, or None if it has none (yet); a one-line error for one that is not
    a record (written by hand, or by another tool)."""
    path = folder / RECORD
    if not path.is_file():
        return None
    damaged = NMTError(f"{path} is not a cell's record; delete it, and compare records the "
                       "cell again")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise damaged from None
    if not isinstance(record, dict) or any(not isinstance(record.get(field), kind)
                                           for field, kind in RECORD_FIELDS.items()):
        raise damaged
    if any(key not in record[field] for field, keys in RECORD_KEYS.items() for key in keys):
        raise damaged
    if not _values_readable(record):
        raise damaged
    return record


def _values_readable(record: dict) -> bool:
    """Whether the values the tables and figures read have the types they are read as."""
    typed = all(isinstance(record[field].get(key), kind) and not isinstance(record[field][key], bool)
                for (field, key), kind in RECORD_VALUES.items())
    if not typed:
        return False
    provenance, segments = record["provenance"], record["train"].get("segments") or []
    try:
        attention_key_size(record["config"]["model"])  # the tables' d_k, of any family
    except NMTError:
        return False
    return (isinstance(record.get("test_set", ""), str)
            # a trial's options (nmt.compare.check_replaceable joins them); none in older records
            and isinstance(record.get("trial", []), list)
            and all(isinstance(option, str) for option in record.get("trial", []))
            and all(isinstance(provenance[key], (str, type(None))) for key in RECORD_KEYS["provenance"])
            and isinstance(segments, list) and all(map(_segment_readable, segments))
            and all(map(_picture_readable, record["pictures"]))
            and all(isinstance(stats, dict) and all(isinstance(v, (int, float, type(None)))
                                                    for v in stats.values())
                    for stats in record["attention_stats"].values()))


def _segment_readable(segment: Any) -> bool:
    """A training segment as the provenance table reads it: its code and device as text (or
    unknown), the step it started from."""
    return (isinstance(segment, dict) and {"code", "from_step", "device"} <= segment.keys()
            and all(isinstance(segment[key], (str, type(None))) for key in ("code", "device"))
            and isinstance(segment["from_step"], int))


def _picture_readable(picture: Any) -> bool:
    """A picture as the figures draw it (``pictures``): its line, its source and target
    pieces, its cross-attention (T, S) and, for a Transformer, its encoder's (H, S, S), of
    numbers, one row as long as another."""
    if not (isinstance(picture, dict) and PICTURE_KEYS <= picture.keys()
            and isinstance(picture["line"], int)):
        return False
    sides = [picture["source"], picture["target"]]
    if not all(isinstance(side, list) and all(isinstance(p, str) for p in side) for side in sides):
        return False
    try:  # as the figures read them
        maps = {kind: torch.tensor(picture[kind]) for kind in ("cross", "encoder") if kind in picture}
    except (TypeError, ValueError, RuntimeError):  # not numbers, or rows of unequal length
        return False
    return (all(m.is_floating_point() for m in maps.values()) and maps["cross"].dim() == 2
            and ("encoder" not in maps or maps["encoder"].dim() == 3))


def read_hypotheses(folder: Path, sentences: int) -> list[str]:
    """The cell's test translations, one a line; a one-line error where they are not the
    record's ``sentences`` lines of UTF-8 (the significance tests pair them line by line)."""
    path = folder / HYPOTHESES
    try:
        hyps = path.read_text(encoding="utf-8").split("\n")[:-1]
    except UnicodeDecodeError:
        hyps = None
    if hyps is None or len(hyps) != sentences:
        raise NMTError(f"{path} is not the cell's {sentences} test translations; delete the cell's "
                       "folder, and compare records the cell again")
    return hyps


def finish_cell(cfg, preset: str, cell, key: str, resolved: dict, run_dir: Path,
                record_dir: Path, trial: list[str] = ()) -> dict:
    """Decode the test split (in fp32 on every machine, so that records compare), measure
    the attention, write the record and hypotheses. ``trial``: the command line's options that
    made the cell another than its preset's (``nmt.compare.trial_options``), which
    ``nmt.compare.check_replaceable`` reads."""
    translator = Translator.from_run_dir(run_dir, precision="32-true")
    sources, references = split_pairs(translator.config.data, "test")
    start = time.perf_counter()
    hyps = best_translations(translator, sources, cfg.beam)
    seconds = time.perf_counter() - start
    record = {
        "cell": asdict(cell), "name": cell.name, "preset": preset, "key": key,
        "trial": list(trial), "config": resolved,
        "scores": {**score_corpus(hyps, references), **lowercase_bleu(hyps, references),
                   "beam": cfg.beam},
        # the report pairs its translations with the references only where they are still these
        "references_sha1": lines_sha1(references),
        "test_set": test_set_name(translator.config.data),  # the tables' footnote names it
        "train": json.loads((run_dir / "train_stats.json").read_text()),
        "decode_sent_per_s": round(len(sources) / seconds, 1),
        "weights": translator.checkpoint.name,  # best.ckpt, or averaged.ckpt where training chose it
        "provenance": provenance(run_dir),
        "attention_stats": attention_statistics(translator.model,
                                                test_batches(translator, sources, references)),
        "pictures": pictures(translator, sources, cfg.plot_sentences, cfg.beam),
    }
    # An earlier record goes first: stopped between the two writes, the cell is not done,
    # rather than done with the earlier record's scores beside these translations
    (record_dir / RECORD).unlink(missing_ok=True)
    write_atomic(record_dir / HYPOTHESES, "".join(h + "\n" for h in hyps))
    write_atomic(record_dir / RECORD, json.dumps(record) + "\n")  # last: the record marks done
    return record


def test_batches(translator: Translator, sources: list[str], references: list[str]) -> list:
    """The test pairs as teacher-forcing batches (source and reference ids)."""
    tokenizer, limit = translator.tokenizer, translator.model.max_positions - 2
    src = [ids[:limit] for ids in tokenizer.encode(sources)]
    tgt = [ids[:limit] for ids in tokenizer.encode(references)]
    return list(decoding_loader(PairDataset(src, tgt), translator.config.data.eval_max_tokens))


def provenance(run_dir: Path) -> dict:
    """Where the cell was recorded: device, precision of the run (as it printed it), versions,
    and the commit of the code that decoded it. The commits and devices each training segment
    ran on are in the record's ``train["segments"]``."""
    return {"device": device_name(), "precision": _printed_precision(run_dir / "train.log"),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "code": code_commit(),
            "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _printed_precision(log: Path) -> str | None:
    """The "precision: ..." line that training printed (``nmt.precision``), if any."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("precision:")), None)


def pictures(translator: Translator, sources: list[str], lines: list[int], beam: int) -> list[dict]:
    """For each plotted test line: source and translation pieces, the last layer's
    cross-attention (mean over heads) and, for a Transformer, the last encoder layer's
    self-attention per head, rounded to 3 decimals."""
    lines = [i for i in lines if i < len(sources)]
    found = translator.translate([sources[i] for i in lines], beam_size=beam)
    out = []
    for line, hyps in zip(lines, found):
        src_ids = translator.encode_lines([sources[line]])[0]
        tgt_ids = [translator.tokenizer.sp.piece_to_id(p) for p in hyps[0].pieces]  # the beam's own
        weights = teacher_forced_weights(translator.model, src_ids, tgt_ids)
        picture = {"line": line,
                   "source": translator.tokenizer.pieces(src_ids) + ["</s>"],
                   "target": translator.tokenizer.pieces(tgt_ids) + ["</s>"],
                   "cross": _rounded(weights["cross"][-1].mean(0))}  # (T, S)
        if "encoder" in weights:
            picture["encoder"] = _rounded(weights["encoder"][-1])  # (H, S, S)
        out.append(picture)
    return out


def _rounded(tensor: torch.Tensor) -> list:
    return (tensor.float() * 1000).round().div(1000).tolist()
