"""Preparing a corpus, once: read and check it, train the joint SentencePiece model on a
sample, encode every split with all cores, and write the piece ids as flat arrays that
training memory-maps (its memory does not grow with the corpus).

``<data_dir>/prepared/<name>.<lang1>-<lang2>.<key>/`` (``<name>``: what it was prepared from,
``_named_after``) holds

* ``spm.model``: the joint SentencePiece model;
* ``<split>.<lang>.ids``: every sentence's piece ids end to end (dtype in ``meta.json``);
* ``<split>.<lang>.lengths.npy``: pieces per sentence (int32), whose running sum gives offsets;
* ``meta.json``, written last (a folder without it is incomplete): the id type, each split's
  pairs, the vocabulary size, and a sha1 of each split's text per language (``text_sha1``),
  which training checks the validation pairs against (either direction: both are recorded).

The key hashes everything the result depends on: each input file's path, size, modification
time and a sample of its bytes (``nmt.data.text_files.file_identity``: named files', a local
dataset folder's; or the Hub dataset's fingerprint), the language pair, ``train_lines``,
``vocab_size`` and ``spm_sample``. Change any of them and a new folder is prepared; the same
inputs reuse it. Both directions of a pair share one folder (the ids are stored per language;
a Hub split is keyed with its languages' columns in sorted order, ``nmt.data.hub.HubSplit``).
What the key cannot see (an edit between the sampled blocks of a large file, its size and
time kept) ``check_prepared_text`` finds in the validation pairs; in the training split it goes
unseen.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from contextlib import suppress
from itertools import chain
from pathlib import Path

import numpy as np

from nmt.config import DataConfig
from nmt.data.batching import Ragged
from nmt.data.corpus import Source, read_pairs, source_identity, split_sources
from nmt.data.hub import hub_name
from nmt.data.tokenizer import Tokenizer, train_tokenizer
from nmt.errors import NMTError, first_line
from nmt.files import one_build_at_a_time
from nmt.memory import usable_cpus

FORMAT = 2  # bump when the layout or the tokenizer's training changes: old folders are then ignored
SAMPLE_SEED = 0  # the tokenizer must not depend on the training seed (runs share it)
WAIT_SECONDS = 4 * 3600  # how long other ranks wait for local rank 0 to prepare
RECENT_FAILURE = 600  # a failure of rank 0 this close before a rank waits is this launch's


def prepared_dir(cfg: DataConfig, sources: dict[str, Source]) -> Path:
    """The folder for this corpus and these options (see the module docstring)."""
    langs = sorted((cfg.src_lang, cfg.tgt_lang))
    inputs = {split: sorted(zip((cfg.src_lang, cfg.tgt_lang), _sides(source)))
              for split, source in sources.items()}
    key = json.dumps([FORMAT, inputs, cfg.train_lines, cfg.vocab_size, cfg.spm_sample])
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return Path(cfg.data_dir) / "prepared" / f"{_named_after(cfg, sources)}.{'-'.join(langs)}.{digest}"


def _named_after(cfg: DataConfig, sources: dict[str, Source]) -> str:
    """What a prepared folder's name says it holds (the key alone tells folders apart): named
    training files' folder and the start their names share (``iwslt14-train`` for
    iwslt14/train.{de,en}; these were named after data.corpus, multi30k), a local dataset
    folder's name, or the Hub dataset or the corpus, with "/" as "--" (one folder under
    prepared/ whatever the name holds: a Hub "owner/name", "../x")."""
    # abspath, not Path.absolute: "../train.de" is in the folder above, not in one named ".."
    # (nor resolve: a linked folder is named as the user named it)
    if cfg.train_files:
        paths = [Path(os.path.abspath(path)) for path in sources["train"]]
        shared = os.path.commonprefix([path.name for path in paths]).rstrip(".-_ ")
        return "-".join(filter(None, (paths[0].parent.name, shared))) or "files"
    if cfg.hub_dataset and Path(cfg.hub_dataset).is_dir():
        return Path(os.path.abspath(cfg.hub_dataset)).name or "dataset"
    return (cfg.hub_dataset or cfg.corpus).replace("/", "--")


def _described(cfg: DataConfig, source: Source) -> str:
    """A split's source as an error message names it: two files' paths, or the Hub dataset."""
    if isinstance(source, (tuple, list)):
        return ", ".join(map(str, source))
    return " ".join(filter(None, ("Hub dataset", hub_name(cfg), cfg.hub_config)))


def _sides(source: Source) -> list:
    identity = source_identity(source)
    return identity if len(identity) == 2 else identity * 2  # a dataset holds both sides


def prepare(cfg: DataConfig, sources: dict[str, Source] | None = None) -> Path:
    """The prepared folder for ``cfg``, built now if missing; ``sources``: its splits'
    (``split_sources``), where found already. Under several processes (DDP) only local rank 0
    builds it; the others wait for it."""
    sources = split_sources(cfg) if sources is None else sources
    folder = prepared_dir(cfg, sources)
    if (folder / "meta.json").is_file():
        return folder
    if int(os.environ.get("LOCAL_RANK", "0")) > 0:
        return _wait_for(folder)
    with one_build_at_a_time(folder):
        if (folder / "meta.json").is_file():  # another process prepared it meanwhile
            return folder
        return _prepare_into(cfg, sources, folder)


def _prepare_into(cfg: DataConfig, sources: dict[str, Source], folder: Path) -> Path:
    """Build ``folder`` (``prepare``, by the process that holds its lock)."""
    print(f"preparing {folder} ...", file=sys.stderr, flush=True)
    remove_abandoned_builds(folder)
    tmp = folder.with_name(f"{_build_prefix(folder)}{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    _failed(folder).unlink(missing_ok=True)
    started = time.perf_counter()
    try:
        remove_incomplete(folder, tmp)
        tmp.mkdir(parents=True)
        _build(cfg, sources, tmp)
        tmp.rename(folder)  # a prepared folder is complete or absent, never half-written
    except Exception as err:
        if isinstance(err, OSError) and (folder / "meta.json").is_file():
            return folder  # another process finished first
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # The ranks waiting for the folder stop with this error instead of waiting for
            # hours (launchers that start every rank themselves may not stop the others).
            _failed(folder).write_text(first_line(err))
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"prepared in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return folder


def _failed(folder: Path) -> Path:
    """Where local rank 0 leaves its error when it could not prepare ``folder``."""
    return folder.with_name(f"{folder.name}.failed")


def _build_prefix(folder: Path) -> str:
    """The name of a folder ``folder`` is built in, but for the building process's id: the
    host's name in it, as the folder may be on a file system other hosts build in too."""
    return f"{folder.name}.tmp-{socket.gethostname()}-"


def remove_abandoned_builds(folder: Path) -> None:
    """The folders in which processes of this host that are gone built ``folder``: one killed
    there (SIGKILL, the out-of-memory killer, SIGTERM) left a half-built folder, gigabytes for
    a large corpus, that nothing else would remove."""
    prefix = _build_prefix(folder)
    for path in folder.parent.glob(glob.escape(prefix) + "*"):
        pid = path.name[len(prefix):]
        if pid.isdecimal() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def remove_incomplete(folder: Path, aside: Path) -> None:
    """``folder`` where it stands without its meta.json: a build renames itself into place
    with it, so this one was changed by hand (its meta.json deleted to prepare it again, as
    ``nmt prepare --list`` shows it: "not a complete prepared folder"), and the build's rename
    would fail on it, every time. Moved to ``aside`` (this process' build folder, removed
    with it) before it is deleted, so that no half-deleted folder stands at its path; a
    folder completed meanwhile by another process (one not held off by the lock) is kept."""
    if not folder.exists() or (folder / "meta.json").is_file():
        return
    if folder.is_symlink() or not folder.is_dir():
        raise NMTError(f"{folder} is not a prepared folder (no meta.json) and not ours to "
                       "delete: remove it, and prepare again")
    print(f"removing {folder}: it has no meta.json", file=sys.stderr, flush=True)
    folder.rename(aside)
    shutil.rmtree(aside)


def process_alive(pid: int) -> bool:
    """Whether a process of this id runs on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)  # no signal sent: only whether it could be
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def _wait_for(folder: Path) -> Path:
    """``folder`` once local rank 0 has prepared it; its error where it failed (a failure
    older than RECENT_FAILURE seconds is an earlier launch's, which rank 0 clears)."""
    started = time.time()
    deadline = time.monotonic() + WAIT_SECONDS
    while not (folder / "meta.json").is_file():
        failed = _failed(folder)
        with suppress(OSError):  # rank 0 may clear it meanwhile
            if failed.stat().st_mtime > started - RECENT_FAILURE:
                raise NMTError(f"local rank 0 could not prepare {folder}: {failed.read_text()}")
        if time.monotonic() > deadline:
            raise NMTError(f"gave up waiting for local rank 0 to prepare {folder}")
        time.sleep(2)
    return folder


def _build(cfg: DataConfig, sources: dict[str, Source], folder: Path) -> None:
    """Prepare into ``folder``, saying each stage's seconds as it ends (a large corpus takes
    minutes)."""
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        print(f"  {stage}: {time.perf_counter() - clock:.0f} s", file=sys.stderr, flush=True)
        clock = time.perf_counter()

    src, tgt = sample_pairs(sources["train"], cfg.spm_sample, cfg.train_lines)
    if not any(line.strip() for line in src + tgt):
        raise NMTError(f"the training split ({_described(cfg, sources['train'])}) holds no text: "
                       "nothing to train SentencePiece or the model on")
    lap("read and sample")
    tokenizer = train_tokenizer(src + tgt, folder / "spm.model", cfg.vocab_size)
    sampled = len(src)
    del src, tgt
    lap("SentencePiece")
    if len(tokenizer) < cfg.vocab_size:  # hard_vocab_limit=False: what the text allows, silently
        pairs = f"{sampled:,} pair{'s' * (sampled != 1)}"
        text = (f"a sample of {pairs} (data.spm_sample) holds" if sampled == cfg.spm_sample
                else f"the training split's {pairs} hold")
        print(f"  note: SentencePiece made {len(tokenizer):,} pieces of the {cfg.vocab_size:,} "
              f"asked (data.vocab_size): {text} no more", file=sys.stderr, flush=True)
    dtype = np.uint16 if len(tokenizer) <= 1 << 16 else np.int32
    pairs, texts = {}, {}
    langs = (cfg.src_lang, cfg.tgt_lang)
    for split, source in sources.items():
        limit = cfg.train_lines if split == "train" else None
        stems = [folder / f"{split}.{lang}" for lang in langs]
        pairs[split], digests = _encode_split(read_pairs(source, limit), tokenizer, dtype, stems)
        texts[split] = dict(zip(langs, digests))
        lap(f"encode {split} ({pairs[split]:,} pairs)")
    meta = {"format": FORMAT, "dtype": np.dtype(dtype).name, "pairs": pairs,
            "vocab_size": len(tokenizer), "text_sha1": texts}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def sample_pairs(source: Source, size: int, limit: int | None) -> tuple[list[str], list[str]]:
    """A uniform random sample of ``size`` pairs, in corpus order: all pairs if there are
    fewer. Each pair draws a random key and the ``size`` smallest keys are kept, so memory
    stays at about 2 x ``size`` pairs however large the corpus."""
    rng = np.random.default_rng(SAMPLE_SEED)
    keys, src, tgt = np.empty(0), [], []
    for s, t in read_pairs(source, limit):
        keys = np.concatenate([keys, rng.random(len(s))])
        src += s
        tgt += t
        if len(keys) >= 2 * size:
            keys, src, tgt = _smallest(keys, src, tgt, size)
    if len(keys) > size:
        keys, src, tgt = _smallest(keys, src, tgt, size)
    return src, tgt


def _smallest(keys: np.ndarray, src: list[str], tgt: list[str], size: int):
    keep = np.sort(np.argpartition(keys, size)[:size])  # sorted: corpus order is kept
    return keys[keep], [src[i] for i in keep], [tgt[i] for i in keep]


def _encode_split(chunks, tokenizer: Tokenizer, dtype, stems: list[Path]
                  ) -> tuple[int, list[str]]:
    """Encode (sources, targets) chunks into ``<stem>.ids`` and ``<stem>.lengths.npy``;
    returns the number of pairs and each side's ``lines_sha1``."""
    threads = usable_cpus()  # SentencePiece's encoding threads: no more than it may run on
    lengths: list[list[np.ndarray]] = [[], []]
    digests = [hashlib.sha1(), hashlib.sha1()]
    with open(f"{stems[0]}.ids", "wb") as src_file, open(f"{stems[1]}.ids", "wb") as tgt_file:
        for texts in chunks:
            for side, (lines, out) in enumerate(zip(texts, (src_file, tgt_file))):
                _add_lines(digests[side], lines)
                ids = tokenizer.encode(lines, threads)
                sizes = np.fromiter(map(len, ids), np.int32, count=len(ids))
                flat = np.fromiter(chain.from_iterable(ids), dtype, count=int(sizes.sum()))
                flat.tofile(out)
                lengths[side].append(sizes)
    for stem, parts in zip(stems, lengths):
        np.save(f"{stem}.lengths.npy", np.concatenate(parts) if parts else np.zeros(0, np.int32))
    return int(sum(len(p) for p in lengths[0])), [digest.hexdigest() for digest in digests]


def _add_lines(digest, lines: list[str]) -> None:
    digest.update("".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass"))


def lines_sha1(lines: list[str]) -> str:
    """sha1 of the lines, each ended by a newline."""
    digest = hashlib.sha1()
    _add_lines(digest, lines)
    return digest.hexdigest()


def check_prepared_text(folder: Path, split: str, texts: dict[str, list[str]]) -> None:
    """``texts`` (a split's lines per language, read now: the validation sources and
    references) must be the text ``folder`` holds the ids of: a source changed since without
    the cache seeing it (a Hub stream revised under the same name) would pair old ids with new
    references. Either direction of the pair: the folder records both languages' text."""
    meta = json.loads((folder / "meta.json").read_text())
    now = {lang: lines_sha1(lines) for lang, lines in texts.items()}
    recorded = meta.get("text_sha1", {}).get(split)
    if recorded is not None:
        changed = any(recorded.get(lang, digest) != digest for lang, digest in now.items())
    else:  # prepared when only the preparing direction's targets were recorded, of either
        # language now (None: prepared before any record)
        legacy = meta.get("target_sha1", {}).get(split)
        changed = legacy is not None and legacy not in now.values()
    if changed:
        raise NMTError(f"the {split} split's text changed since it was prepared in {folder}: "
                       "delete that folder and it is prepared again from the text as it is now")


def load_side(folder: Path, split: str, lang: str) -> Ragged:
    """One language side of a prepared split, its ids memory-mapped (read on demand); a
    one-line error naming the folder where its files do not add up (changed since written)."""
    def damaged(what: str) -> NMTError:
        return NMTError(f"the prepared corpus in {folder} is damaged ({what}): delete the folder "
                        "and it is prepared again")

    try:
        meta = json.loads((folder / "meta.json").read_text())
        pairs, dtype = meta["pairs"], np.dtype(meta["dtype"])
    except (FileNotFoundError, ValueError, TypeError, KeyError) as err:  # deleted since found
        raise damaged(f"meta.json: {first_line(err)}") from None
    if split not in pairs:
        raise NMTError(f"split '{split}' was not prepared in {folder}")
    path = folder / f"{split}.{lang}.ids"
    try:
        lengths = np.load(folder / f"{split}.{lang}.lengths.npy").astype(np.int64)
        size = path.stat().st_size
    except (OSError, ValueError) as err:
        raise damaged(first_line(err)) from None
    if size != int(lengths.sum()) * dtype.itemsize:
        raise damaged(f"{path.name} holds {size} bytes, its lengths {int(lengths.sum())} ids")
    # numpy cannot map an empty file
    ids = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    return Ragged(ids, np.cumsum(lengths) - lengths, lengths)


def prepared_folders(data_dir: str | Path) -> list[dict]:
    """What ``<data_dir>/prepared/`` holds, for ``nmt prepare --list``: per folder its name,
    state (prepared; being built, or left by a build that was killed; no meta.json), pairs
    per split and vocabulary size (from meta.json), bytes on disk and when it was prepared."""
    rows = []
    root = Path(data_dir) / "prepared"
    for folder in sorted(root.iterdir() if root.is_dir() else (), key=lambda p: p.name):
        if not folder.is_dir():  # <folder>.lock and <folder>.failed beside the folders
            continue
        meta, row = folder / "meta.json", {"name": folder.name, "pairs": None, "vocab": None}
        row["bytes"] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        row["when"] = (meta if meta.is_file() else folder).stat().st_mtime
        if ".tmp-" in folder.name:
            row["state"] = "being built, or left by a build that was stopped"
        elif not meta.is_file():
            row["state"] = "no meta.json: not a complete prepared folder"
        else:
            with suppress(OSError, ValueError, AttributeError):  # damaged: listed without them
                info = json.loads(meta.read_text(encoding="utf-8"))
                row["pairs"], row["vocab"] = info.get("pairs"), info.get("vocab_size")
            row["state"] = "prepared" if row["pairs"] is not None else "meta.json unreadable"
        rows.append(row)
    return rows
