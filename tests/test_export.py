"""nmt export to CTranslate2: the exported model decodes as ours does (tiny trained run),
int8 works, and runs CTranslate2 cannot execute get a one-line reason."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt import ctranslate2_translator, export, search
from nmt.attention_stats import attention_matrix
from nmt.cli import main
from nmt.config import load_config, save_config
from nmt.ctranslate2_translator import CTranslate2Translator, ranked
from nmt.data.batching import collate
from nmt.data.tokenizer import BOS, EOS_PIECE, PAD
from nmt.translator import Translator

from .test_cli import corpus, run  # noqa: F401  (module-scoped fixtures: a tiny trained run)


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "ct2"
    assert main(["export", "--checkpoint", str(run), "--format", "ctranslate2", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def sources(corpus) -> list[str]:
    _, files = corpus
    lines = []
    for split in ("val", "test"):
        with open(files[split][0], encoding="utf-8") as f:
            lines += f.read().splitlines()
    return lines


def test_export_writes_model_beside_tokenizer_and_config(exported):
    for name in ("model.bin", "shared_vocabulary.json", "spm.model", "config.yaml", "source.json"):
        assert (exported / name).is_file(), name


def test_float32_greedy_equals_ours(run, exported, sources):
    ours = Translator.from_run_dir(run, "cpu", precision="32-true").translate(sources, beam_size=1)
    theirs = CTranslate2Translator(exported).translate(sources, beam_size=1)
    same = sum(a[0].text == b[0].text for a, b in zip(ours, theirs))
    assert same >= 0.99 * len(sources), f"{same} of {len(sources)} lines equal"


def test_float32_attention_matches_ours(run, exported, sources):
    """Each decoding step's cross-attention (last layer, mean over heads) agrees."""
    lines = sources[:8]
    ours = Translator.from_run_dir(run, "cpu", precision="32-true").translate(lines, 1, need_attn=True)
    theirs = CTranslate2Translator(exported).translate(lines, 1, need_attn=True)
    for (a,), (b,) in zip(ours, theirs):
        assert a.pieces == b.pieces and a.source == b.source
        assert b.attention.size(0) == len(b.pieces) + 1  # a row for every piece and for EOS
        torch.testing.assert_close(b.attention, attention_matrix(a.attention), atol=1e-4, rtol=1e-3)


def test_an_export_aligns_words_as_ours(run, exported, sources, tmp_path, capsys):
    """translate --alignment reads the same map from either engine (the last layer's mean over
    heads): the same rows, translations and pairs, in float32."""
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sources[:8]) + "\n", encoding="utf-8")
    rows = []
    for options in (["--checkpoint", str(run), "--precision", "32-true"],
                    ["--checkpoint", str(exported), "--engine", "ctranslate2"]):  # exported in float32
        assert main(["translate", *options, "--input", str(source), "--beam", "1", "--alignment"]) == 0
        rows.append(capsys.readouterr().out.splitlines())
    assert rows[0] == rows[1] and all(" ||| " in row for row in rows[0])
    # its one map is the last layer's mean: "layer 0" or "head 0" would have been that map, relabelled
    for option in (["--attention-layer", "0"], ["--attention-head", "0"]):
        assert main(["translate", "--checkpoint", str(exported), "--engine", "ctranslate2", "--input",
                     str(source), "--alignment", *option]) == 1
        err = capsys.readouterr().err
        assert "CTranslate2 gives one attention map" in err and err.count("\n") == 1


def test_a_hypothesis_that_ends_itself_keeps_its_eos_attention_row(exported):
    """CTranslate2 hands back EOS (return_end_token), so a sentence that ends by itself has the
    EOS step's attention row, as ours does; EOS is not a piece of the text. A hypothesis cut at
    the length limit keeps the row of the step after the cut, where ours forces EOS."""
    translator = CTranslate2Translator(exported)
    words = translator.tokenizer.pieces(list(range(4, 10)))
    source = [words[0], EOS_PIECE]
    rows = [[0.25, 0.75], [0.5, 0.5], [0.875, 0.125], [0.375, 0.625]]  # exact in float32
    ended = type("Result", (), {"hypotheses": [[*words[:3], EOS_PIECE]], "scores": [-2.0],
                                "attention": [rows]})()
    mine = translator._hypothesis(ended, 0, limit=10, source=source, need_attn=True)
    assert mine.pieces == words[:3] and mine.log_prob == -2.0
    assert mine.attention.tolist() == rows  # 3 pieces + EOS
    cut = translator._hypothesis(ended, 0, limit=2, source=source, need_attn=True)
    assert cut.pieces == words[:2] and cut.attention.tolist() == rows[:3]


def test_beam_attention_belongs_to_each_sentence(run, exported, sources):
    """With beam search too, a sentence's attention is its own: the first step (from BOS,
    the same in every search) equals ours for sentences of different lengths decoded together."""
    lines = sources[:6]
    ours = Translator.from_run_dir(run, "cpu", precision="32-true").translate(lines, 3, need_attn=True)
    theirs = CTranslate2Translator(exported).translate(lines, 3, need_attn=True)
    for (a, *_), (b, *_) in zip(ours, theirs):
        torch.testing.assert_close(b.attention[0], attention_matrix(a.attention)[0], atol=1e-4, rtol=1e-3)


def test_a_beam_output_does_not_depend_on_the_lines_beside_it(exported, sources):
    """CTranslate2 takes one length limit per call: searched beside a longer line, a beam may
    run past a sentence's own limit and find other hypotheses. Each sentence's n-best list is
    the same decoded with all the others and decoded alone (the tiny model's hypotheses run to
    their limits often)."""
    translator = CTranslate2Translator(exported)
    lines = sources[:24] + [" ".join(sources[:6])]  # and a long one, whose limit is the longest
    together = translator.translate(lines, beam_size=3, nbest=3)
    for line, found in zip(lines, together):
        alone = translator.translate([line], beam_size=3, nbest=3)[0]
        assert [h.text for h in found] == [h.text for h in alone], line


def test_a_beam_search_keeps_the_first_k_hypotheses_to_end_as_ours(run, exported, sources,
                                                                   monkeypatch):
    """With PAD and BOS taken out of our softmax as CTranslate2 suppresses them (the tiny
    model gives them weight, so the two engines' probabilities would differ), CTranslate2's K
    hypotheses are ours, in our order, for every sentence whose K ended within its limit (on
    this run: of more than K ended at once it keeps the K of the highest log-probability x
    length, at times not ours, the first K; see ctranslate2_translator.SEARCH_LENGTH_PENALTY). CTranslate2
    without a length penalty searched on until its best candidate had ended, and kept the K of
    the highest log-probability: 14 to 27 of the 39 to 49 such sentences differed at beams 3,
    5 and 8."""
    restrict = search.restrict

    def as_ctranslate2(log_probs, must_end):
        log_probs[..., PAD] = log_probs[..., BOS] = float("-inf")
        log_probs.copy_(log_probs.log_softmax(-1))
        return restrict(log_probs, must_end)

    monkeypatch.setattr(search, "restrict", as_ctranslate2)
    ours = Translator.from_run_dir(run, "cpu", precision="32-true")
    ours.config.decoding.prune_margin = None  # the full beam, as CTranslate2's
    theirs = CTranslate2Translator(exported)
    sentences = [ids for ids in theirs.encode_lines(sources) if ids]
    lines = theirs.tokenizer.decode(sentences)
    limits = theirs._budgets([theirs.tokenizer.pieces(ids) + [EOS_PIECE] for ids in sentences],
                             theirs.config.decoding.max_len_ratio)
    for beam in (3, 5, 8):
        compared = 0
        for line, limit, mine, found in zip(lines, limits, ours.translate(lines, beam, beam),
                                            theirs.translate(lines, beam, beam)):
            if all(len(hyp.pieces) < limit - 1 for hyp in mine):  # none ended by the limit
                compared += 1
                assert [h.pieces for h in found] == [h.pieces for h in mine], (beam, line)
        assert compared >= 15, beam


def test_float32_log_probs_match_ours(run, exported, corpus):
    """Teacher-forced log-probabilities of the reference translations, token by token: the
    whole network (embeddings, positions, every layer, final norms, tied output layer)."""
    _, files = corpus
    src, tgt = ([line.strip() for line in open(files["test"][i], encoding="utf-8")][:10] for i in (0, 1))
    translator = Translator.from_run_dir(run, "cpu", precision="32-true")
    tokenizer = translator.tokenizer
    src_ids, tgt_ids = tokenizer.encode(src), tokenizer.encode(tgt)
    batch = collate(list(zip(range(len(src)), src_ids, tgt_ids)))
    with torch.no_grad():
        log_probs = translator.model(batch.src, batch.src_mask, batch.tgt_in).log_softmax(-1)
    ours = log_probs.gather(-1, batch.tgt_out.unsqueeze(-1)).squeeze(-1)  # (B, T)
    theirs = CTranslate2Translator(exported).engine.score_batch(
        [tokenizer.pieces(s) + [EOS_PIECE] for s in src_ids], [tokenizer.pieces(t) for t in tgt_ids])
    for row, ids, result in zip(ours, tgt_ids, theirs):
        torch.testing.assert_close(torch.tensor(result.log_probs), row[: len(ids) + 1],
                                   atol=1e-3, rtol=1e-4)


def test_translate_cli_with_ctranslate2_engine(run, exported, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("haus mann\n\nkatze blau im park\n", encoding="utf-8")
    outputs = []
    for engine, model, extra in (("torch", run, ["--precision", "32-true"]),
                                 ("ctranslate2", exported, []),
                                 ("ctranslate2", exported, ["--buffer-lines", "2"])):
        assert main(["translate", "--checkpoint", str(model), "--engine", engine,
                     "--input", str(source), "--beam", "1", *extra]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2] and outputs[1].count("\n") == 3


def test_an_export_warns_once_its_run_has_moved_on(run, tmp_path, capsys):
    """An export did not say which checkpoint it came from, so one made before the run trained
    on translated with the old weights without a word. It records the file now, and the
    ctranslate2 engine warns in one line where that file was written again or the run now
    translates with another; an export whose run is not on this machine (a server) is quiet."""
    copy, out = tmp_path / "run", tmp_path / "run.ct2"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval"))
    assert main(["export", "--checkpoint", str(copy), "--out", str(out)]) == 0
    best = copy / "best.ckpt"
    recorded = json.loads((out / "source.json").read_text())
    assert recorded["checkpoint"] == str(best.resolve()) and recorded["run_choice"]
    source = tmp_path / "in.txt"
    source.write_text("haus mann\n", encoding="utf-8")

    def warning() -> str:
        capsys.readouterr()
        assert main(["translate", "--engine", "ctranslate2", "--checkpoint", str(out),
                     "--input", str(source)]) == 0
        return capsys.readouterr().err

    assert warning() == ""
    written = best.stat().st_mtime_ns
    os.utime(best, ns=(written, written + 10**9))  # the run trained on and wrote it anew
    assert warning() == (f"warning: {out} is out of date: {best.resolve()} has been written again "
                         "since it was exported (the run trained on); export it again (nmt export)\n")
    os.utime(best, ns=(written, written))
    shutil.copyfile(best, copy / "averaged.ckpt")  # training chose its average since
    (copy / "train_stats.json").write_text(json.dumps({"final_weights": "averaged.ckpt"}))
    assert warning() == (f"warning: {out} is out of date: {copy.resolve()} now translates with "
                         "averaged.ckpt, not the best.ckpt it was exported from; export it again "
                         "(nmt export)\n")
    copy.rename(tmp_path / "moved")  # the run is not where the export came from
    assert warning() == ""


def test_evaluate_with_ctranslate2_engine_scores_as_ours(run, exported):
    bleu = []
    for engine, model, fp32 in (("torch", run, ["--precision", "32-true"]), ("ctranslate2", exported, [])):
        assert main(["evaluate", "--checkpoint", str(model), "--engine", engine, "--beam", "1", *fp32]) == 0
        scores = json.loads((model / "eval" / "test.beam1.json").read_text())  # 32-true: the run's
        assert scores["engine"] == engine  # the JSON says what decoded it
        assert scores["device"] == "cpu" and scores["device_name"].startswith("CPU: ")
        assert scores["precision"] == ("32-true" if fp32 else "float32")  # the export's float32
        bleu.append(scores["bleu"])
    assert bleu[0] == bleu[1]


def test_bench_decode_both_engines_side_by_side(run, capsys):
    assert main(["bench", "decode", "--checkpoint", str(run), "--engine", "torch,ctranslate2",
                 "--beam", "1,2", "--limit", "6"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    rows = [(r["engine"], r["mode"]) for r in summary["rows"]]
    assert rows == [("torch", "greedy"), ("ctranslate2", "greedy"), ("torch", "beam2"),
                    ("ctranslate2", "beam2"), ("torch", "greedy_recompute")]
    assert set(summary["ctranslate2_float32_speedup"]) == {"greedy", "beam2"}
    assert all(r["sent_per_s"] > 0 for r in summary["rows"])
    # CTranslate2 alone: its rows, and no torch row (the recompute row is torch's)
    assert main(["bench", "decode", "--checkpoint", str(run), "--engine", "ctranslate2",
                 "--beam", "1", "--limit", "6"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [(r["engine"], r["mode"]) for r in summary["rows"]] == [("ctranslate2", "greedy")]


def test_bench_decode_unknown_engine(run, capsys):
    assert main(["bench", "decode", "--checkpoint", str(run), "--engine", "torch,onnx"]) == 1
    assert "unknown engine 'onnx'" in capsys.readouterr().err


@pytest.mark.parametrize("device,message", [
    ("tpu", "unknown device 'tpu'; choose cpu, cuda or cuda:N"),
    ("cuda", "no CUDA device is available") if not torch.cuda.is_available()
    else ("cuda:99", "CUDA device(s), numbered from 0"),
])
def test_bad_device_for_either_engine_is_one_line(run, exported, tmp_path, capsys, device, message):
    source = tmp_path / "in.txt"
    source.write_text("haus\n", encoding="utf-8")
    for engine, model in (("torch", run), ("ctranslate2", exported)):
        assert main(["translate", "--checkpoint", str(model), "--engine", engine,
                     "--input", str(source), "--device", device]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and "damaged" not in err


def test_ctranslate2_decodes_on_the_cpu_unless_asked(exported, monkeypatch):
    """As before --device was checked: torch seeing a GPU does not move CTranslate2 to it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert CTranslate2Translator(exported).engine.device == "cpu"


def test_precision_is_for_the_torch_engine(run, tmp_path, capsys):
    out = tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(run), "--format", "ctranslate2", "--out", str(out)]) == 0
    assert main(["translate", "--engine", "ctranslate2", "--checkpoint", str(out),
                 "--precision", "bf16-mixed"]) == 1
    assert "--precision is for the torch engine" in capsys.readouterr().err


def test_int8_export_translates(run, tmp_path, sources, exported, capsys):
    out = tmp_path / "int8"
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(run), "--quantization", "int8", "--out", str(out)]) == 0
    # nothing is decoded: no decoding precision chosen (auto's probe took seconds) or named
    assert "precision" not in "".join(capsys.readouterr())
    results = CTranslate2Translator(out).translate(sources[:5], beam_size=2)
    assert len(results) == 5 and all(r[0].pieces for r in results)
    # Quantized: its weight matrices take a byte per value where float32's take four (this
    # tiny model's biases, norms and scales stay float32: 0.6 of the size here).
    assert (out / "model.bin").stat().st_size < 0.75 * (exported / "model.bin").stat().st_size


@pytest.mark.parametrize("model,message", [
    ({"family": "rnn", "attention": "additive"}, "implements Transformers only"),
    ({"family": "transformer", "attention": "general"}, "scaled dot-product attention only"),
])
def test_unsupported_runs_get_one_line_reason(run, tmp_path, capsys, model, message):
    other = tmp_path / "other"
    config = load_config(run / "config.yaml")
    config.model = model
    save_config(config, other / "config.yaml")
    assert main(["export", "--checkpoint", str(other), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_new_familys_run_is_refused_for_what_it_is(toy_registries, tmp_path, capsys):
    """A new family's run was refused as "a recurrent encoder-decoder with Bahdanau attention",
    the words for the RNN, whatever the family was."""
    from .toys import toy_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(toy_config(tmp_path, {split: ["x.src", "x.tgt"] for split in ("train", "val", "test")}),
                run_dir / "config.yaml")
    assert main(["export", "--checkpoint", str(run_dir), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == ("error: CTranslate2 cannot run a 'toy' model: nmt export "
                                       "converts the transformer family alone (CTranslate2 "
                                       "implements Transformers only)\n")


@pytest.mark.parametrize("argv,message", [
    (["--quantization", "int4"], "unknown quantization 'int4'"),
    (["--format", "onnx"], "unknown export format 'onnx'"),
])
def test_bad_export_options(run, tmp_path, capsys, argv, message):
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "o"), *argv]) == 1
    assert message in capsys.readouterr().err


def test_export_never_replaces_a_directory_that_is_not_an_export(run, tmp_path, capsys):
    keep = tmp_path / "precious"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    assert main(["export", "--checkpoint", str(run), "--out", str(keep)]) == 1
    assert "is not a CTranslate2 export" in capsys.readouterr().err
    assert (keep / "notes.txt").read_text() == "mine"


def test_an_export_replaced_keeps_its_folders_permissions(run, exported, tmp_path):
    """A private export (chmod 700) exported again became readable by all (755, the umask's):
    the new folder, written beside it and swapped in, took the umask's mode."""
    out = tmp_path / "ct2"
    shutil.copytree(exported, out, ignore=shutil.ignore_patterns("eval"))  # others evaluate it
    out.chmod(0o700)
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 0
    assert (out / "model.bin").is_file() and stat.S_IMODE(out.stat().st_mode) == 0o700


def test_an_export_keeps_its_run_files_permissions(run, tmp_path):
    """A private run's SentencePiece model and config (chmod 600) became readable by all in
    its export (644, the umask's) once they were read first and written anew."""
    private = tmp_path / "private_run"
    shutil.copytree(run, private, ignore=shutil.ignore_patterns("eval", "steps"))
    for name in ("spm.model", "config.yaml"):
        (private / name).chmod(0o600)
    out = tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(private), "--out", str(out)]) == 0
    assert [stat.S_IMODE((out / name).stat().st_mode) for name in ("spm.model", "config.yaml")] \
        == [0o600, 0o600]


def test_ctranslate2_engine_needs_an_export(run, exported, capsys):
    assert main(["translate", "--checkpoint", str(run), "--engine", "ctranslate2"]) == 1
    err = capsys.readouterr().err
    assert "takes a folder written by nmt export" in err and f"--out {run}" not in err
    assert main(["translate", "--checkpoint", str(exported)]) == 1  # and the torch engine
    assert f"{exported} is a CTranslate2 export: decode it with --engine ctranslate2" in \
        capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["export", "--checkpoint", "{exported}", "--out", "{out}"],
     "nmt export takes the training run it came from"),
    (["bench", "decode", "--checkpoint", "{exported}", "--engine", "ctranslate2"],
     "bench decode takes a training run (--engine ctranslate2 exports it in float32)"),
    (["translate", "--checkpoint", "{exported}", "--ensemble", "{run}"],
     "--ensemble takes training runs"),
])
def test_an_export_where_a_training_run_is_needed_is_named_so(run, exported, tmp_path, capsys,
                                                              argv, message):
    """They said "decode it with --engine ctranslate2": the option bench decode was given, one
    export does not take, and one that refuses --ensemble."""
    names = {"exported": exported, "run": run, "out": tmp_path / "again.ct2"}
    assert main([arg.format(**names) for arg in argv]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {exported} is a CTranslate2 export: {message}\n"


def test_a_failed_export_leaves_the_earlier_one_whole(run, tmp_path, capsys, monkeypatch):
    """CTranslate2 deleted the output folder before it wrote: an export that failed half-way
    (a file size limit here) left a model.bin without its config, which translated nothing."""
    out = tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def fails_half_way(self, output_dir, **options):
        Path(output_dir).mkdir()
        (Path(output_dir) / "model.bin").write_bytes(b"half")
        raise OSError(27, "File too large")

    monkeypatch.setattr(export.RunConverter, "convert", fails_half_way)
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 1
    assert "File too large" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # no folder left half-written
    monkeypatch.undo()
    # Stopped between moving the earlier export aside and moving the new one in: put back.
    rename = Path.rename

    def stops_at_the_second(self, target):
        if self.name.startswith(".ct2.new"):
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", stops_at_the_second)
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 130
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]


@pytest.mark.parametrize("given", [".", "../ct2"])
def test_an_export_is_not_replaced_from_inside_it(run, exported, tmp_path, capsys, monkeypatch,
                                                  given):
    """nmt export --out . in the export's folder swapped a new folder in and removed the one
    the shell was in: it was left in a removed folder, where ls showed nothing."""
    out = tmp_path / "ct2"
    shutil.copytree(exported, out, ignore=shutil.ignore_patterns("eval"))  # others evaluate it
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.chdir(out)
    assert main(["export", "--checkpoint", str(run), "--out", given]) == 1
    assert capsys.readouterr().err == (
        f"error: --out {given} is the folder this command runs in, which the export would "
        "replace, leaving your shell in a removed folder: run it from outside (cd ..)\n")
    assert os.path.samefile(".", out) and {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_an_export_stopped_part_of_the_way_leaves_no_folder_behind(run, tmp_path, stop):
    """SIGTERM (a scheduler, kill) or SIGHUP (a closed terminal) while CTranslate2 wrote left
    its hidden, half-written folder beside --out for good (exit 143); as Ctrl-C, it is removed."""
    out = tmp_path / "ct2"
    code = f"""if True:
        import os, sys
        from pathlib import Path
        from nmt import export
        from nmt.cli import main

        def stopped_half_way(self, output_dir, **options):
            Path(output_dir).mkdir()
            (Path(output_dir) / "model.bin").write_bytes(b"half")
            os.kill(os.getpid(), {int(stop)})

        export.RunConverter.convert = stopped_half_way
        sys.exit(main(["export", "--checkpoint", {str(run)!r}, "--out", {str(out)!r}]))"""
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300, preexec_fn=lambda: signal.signal(stop, signal.SIG_DFL))
    assert process.returncode == 128 + stop, process.stderr  # as the signal's default
    assert process.stderr.endswith(f"stopped by {stop.name}\n"), process.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_export_that_cannot_be_written_names_its_out_folder(run, tmp_path, capsys, monkeypatch):
    """A folder --out cannot be made in (read-only) was named by the hidden folder beside
    --out that the export writes first, and removes: "error: /abs/.ct2.new123: Permission
    denied"."""
    def refused(self, output_dir, **options):  # as os.makedirs in a read-only folder
        raise PermissionError(13, "Permission denied", output_dir)

    monkeypatch.setattr(export.RunConverter, "convert", refused)
    out = tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 1
    assert capsys.readouterr().err == f"error: cannot write {out}: Permission denied\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("failure,code", [(OSError(28, "No space left on device"), 1),
                                          (KeyboardInterrupt(), 130)])
def test_a_failed_export_leaves_no_folder_it_made(run, tmp_path, capsys, monkeypatch, failure, code):
    """A failed export into a new nested --out a/b/c.ct2 left a/b behind, made by CTranslate2
    for its hidden folder beside --out; a folder that was there stays."""
    def failed(self, output_dir, **options):  # as CTranslate2: os.makedirs, then a write fails
        os.makedirs(output_dir)
        raise failure

    monkeypatch.setattr(export.RunConverter, "convert", failed)
    (tmp_path / "kept").mkdir()
    for out in (tmp_path / "a" / "b" / "c.ct2", tmp_path / "kept" / "b" / "c.ct2"):
        assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == code
    assert [path.name for path in tmp_path.rglob("*")] == ["kept"]


def test_a_run_file_that_cannot_be_read_is_named(run, tmp_path, capsys, monkeypatch):
    """The run's spm.model gone once its model had loaded (removed meanwhile, a failing disk):
    its copy beside the export failed as "cannot write OUT: No such file or directory", which
    sent the user looking at --out."""
    mine = tmp_path / "run"
    shutil.copytree(run, mine, ignore=shutil.ignore_patterns("steps", "logs"))
    load = Translator.from_run_dir

    def load_then_lose(*args, **kwargs):
        translator = load(*args, **kwargs)
        (mine / "spm.model").unlink()
        return translator

    monkeypatch.setattr(export.Translator, "from_run_dir", load_then_lose)
    out = tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(mine), "--out", str(out)]) == 1
    assert capsys.readouterr().err == f"error: cannot read {mine / 'spm.model'}: No such file or directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("name", ["best.ckpt", "spm.model"])
def test_a_run_file_it_may_not_read_is_not_called_damaged(run, tmp_path, name):
    """A checkpoint or SentencePiece model without read permission (another user's run) was
    "incompatible or damaged checkpoint ([Errno 13] ...)" and "is not a SentencePiece model",
    which has a user retrain or delete a sound run."""
    mine = tmp_path / "run"
    shutil.copytree(run, mine, ignore=shutil.ignore_patterns("steps", "logs"))
    (mine / name).chmod(0)
    process = subprocess.run([*without_root_reads(), sys.executable, "-m", "nmt", "export",
                              "--checkpoint", str(mine), "--weights", "best.ckpt",
                              "--out", str(tmp_path / "ct2")], capture_output=True, text=True,
                             timeout=300)
    assert process.returncode == 1
    assert process.stderr == f"error: cannot read {mine / name}: Permission denied\n"


def without_root_reads() -> list[str]:
    """A command's prefix that takes away root's right to read any file (the tests may run as
    root), so that a file's permissions apply; none for another user."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("run as root without setpriv: every file is readable")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", "--bounding-set", caps, "--inh-caps", caps, "--"]


def test_export_over_an_export_keeps_what_else_is_there(run, tmp_path, capsys):
    """A new export replaces the output folder whole: an earlier export is replaced only when
    it holds nothing but an export's files (an evaluation's eval/ would be lost)."""
    out = tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 0
    assert main(["export", "--checkpoint", str(run), "--out", str(out), "--quantization", "int8"]) == 0
    assert main(["evaluate", "--checkpoint", str(out), "--engine", "ctranslate2", "--beam", "1"]) == 0
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "holds files nmt export did not write (eval), which the new export would delete" in err
    assert (out / "eval" / "test.beam1.json").is_file()
    assert main(["export", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 1
    assert "checkpoint directory not found" in capsys.readouterr().err
    link = tmp_path / "link"
    link.symlink_to(out)
    assert main(["export", "--checkpoint", str(run), "--out", str(link)]) == 1
    assert "is a symbolic link: name the folder itself" in capsys.readouterr().err


def teacher_forced(run, tokenizer, pairs: list[tuple[list[int], list[int]]]) -> list[float]:
    """Our model's log-probability of each (source ids, target ids) pair's target + EOS."""
    model = Translator.from_run_dir(run, "cpu", precision="32-true").model.eval()
    batch = collate([(n, src, tgt) for n, (src, tgt) in enumerate(pairs)])
    with torch.no_grad():
        log_probs = model(batch.src, batch.src_mask, batch.tgt_in).log_softmax(-1)
    forced = log_probs.gather(-1, batch.tgt_out.unsqueeze(-1)).squeeze(-1)  # (N, T)
    return [float(row[: len(tgt) + 1].sum()) for row, (_, tgt) in zip(forced, pairs)]


def test_greedy_output_cut_at_the_length_limit_is_scored_as_ours_scores_it(run, exported, sources):
    """Output budgets of 5 steps (max_len_ratio 0): CTranslate2 takes one maximum length per
    batch and forces no EOS, so its outputs run past a sentence's limit and are cut. Each
    one's log-probability is then the model's for its pieces + a forced EOS, as ours (here
    teacher-forced), not CTranslate2's for pieces cut off."""
    translator = CTranslate2Translator(exported)
    translator.config.decoding.max_len_ratio = 0.0
    lines = sources[:12]
    results = translator.translate(lines, beam_size=1)
    tokenizer = translator.tokenizer
    targets = [[tokenizer.sp.piece_to_id(p) for p in hyp.pieces] for hyp, in results]
    assert sum(len(tgt) == 4 for tgt in targets) >= len(lines) // 2  # cut: 5 steps - EOS
    expected = teacher_forced(run, tokenizer, list(zip(tokenizer.encode(lines), targets)))
    assert [hyp.log_prob for hyp, in results] == pytest.approx(expected, abs=1e-3)


def test_beam_hypotheses_cut_to_the_same_pieces_are_one_scored_as_ours(run, exported, sources):
    """Beam hypotheses that ran past the limit (CTranslate2's scores for more pieces, without
    EOS) are scored for the pieces kept + EOS; two cut to the same pieces are listed once. Over
    real searches at budgets of 5 steps, n-best lists hold distinct hypotheses, best first."""
    translator = CTranslate2Translator(exported)
    tokenizer = translator.tokenizer
    source_ids = tokenizer.encode(sources[:1])[0]
    source = tokenizer.pieces(source_ids) + [EOS_PIECE]
    words = tokenizer.pieces(list(range(4, 10)))
    found = type("Result", (), {"hypotheses": [words[:5], words[:4] + [words[5]], words[:2] + [EOS_PIECE]],
                                "scores": [-1.0, -0.5, -3.0]})()
    hyps = [translator._hypothesis(found, k, limit=4, source=source, need_attn=False) for k in range(3)]
    translator._score_cut([source], [hyps])
    listed = ranked(hyps, alpha=1.0)
    assert sorted(len(hyp.pieces) for hyp in listed) == [2, 4]
    cut = next(hyp for hyp in listed if len(hyp.pieces) == 4)
    assert cut.log_prob == pytest.approx(
        teacher_forced(run, tokenizer, [(source_ids, list(range(4, 8)))])[0], abs=1e-3)
    assert next(hyp for hyp in listed if len(hyp.pieces) == 2).log_prob == -3.0  # ended: as found
    translator.config.decoding.max_len_ratio = 0.0
    for hyps in translator.translate(sources[:12], beam_size=3, nbest=3, alpha=1.0):
        assert len({tuple(hyp.pieces) for hyp in hyps}) == len(hyps) > 0
        assert [hyp.score for hyp in hyps] == sorted((hyp.score for hyp in hyps), reverse=True)


def test_export_of_another_checkpoint_of_the_run(run, tmp_path, corpus):
    """--weights: the export decodes with that file's weights (a copy of the run's with its
    embeddings scaled, so that they differ), as translate --weights does."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    checkpoint = torch.load(copy / "last.ckpt", map_location="cpu", weights_only=False)
    checkpoint["state_dict"] = {name: value * 1.5 if "embed" in name else value
                                for name, value in checkpoint["state_dict"].items()}
    torch.save(checkpoint, copy / "other.ckpt")
    out = tmp_path / "other.ct2"
    assert main(["export", "--checkpoint", str(copy), "--weights", "other.ckpt", "--out", str(out)]) == 0
    _, files = corpus
    lines = open(files["test"][0], encoding="utf-8").read().splitlines()[:10]
    theirs = [h.log_prob for h, in CTranslate2Translator(out).translate(lines, beam_size=1)]
    for weights, same in (("other.ckpt", True), ("last.ckpt", False)):
        ours = Translator.from_run_dir(copy, "cpu", weights, precision="32-true").translate(lines, 1)
        assert (theirs == pytest.approx([h.log_prob for h, in ours], abs=1e-3)) == same, weights


def test_an_export_is_served_with_its_attention(exported, sources):
    """nmt serve --engine ctranslate2: the answers are the export's own translations, and
    each text's attention has a row per target piece (EOS included) and a column per source
    piece; an empty text has none."""
    pytest.importorskip("litserve")
    from nmt.serve.api import TranslationAPI

    api = TranslationAPI({"ct2": str(exported)}, "ctranslate2", default_beam=2, max_batch=4)
    api.setup("cpu")
    job = api.decode_request({"text": [*sources[:4], ""], "attention": True})
    answer = api._translate_group([job])[0]
    # with attention, as served (a beam search then decodes each sentence alone: see
    # CTranslate2Translator, its limit is then the sentence's own)
    own = CTranslate2Translator(exported).translate(sources[:4], beam_size=2, need_attn=True)
    assert answer["model"] == "ct2" and answer["translations"] == [r[0].text for r in own] + [""]
    for view, result in zip(answer["attention"], own):
        assert view["target"][:-1] == result[0].pieces and view["target"][-1] == "</s>"
        assert len(view["weights"]) == len(view["target"])
        assert all(len(row) == len(view["source"]) for row in view["weights"])
        assert all(sum(row) == pytest.approx(1, abs=1e-2) for row in view["weights"])
    assert answer["attention"][-1] is None
    # its one map is the last layer's mean over heads: layer 0 or head 0 would mislabel it
    assert api.decode_request({"text": ["x"], "attention_layer": -1}).texts == ["x"]
    for choice in ({"attention_layer": 0}, {"attention_head": 0}):
        refused = api.decode_request({"text": ["x"], "attention": True, **choice})
        assert refused.message == ("an export translated with CTranslate2 gives one attention map, "
                                   "the last layer's mean over heads: no 'attention_layer' or "
                                   "'attention_head' to pick")


def test_an_export_without_room_on_the_device_is_not_called_damaged(exported, tmp_path, capsys,
                                                                    monkeypatch):
    def out_of_memory(*args, **kwargs):  # as CTranslate2 reports a full GPU
        raise RuntimeError("CUDA failed with error out of memory")

    monkeypatch.setattr(ctranslate2_translator.ctranslate2, "Translator", out_of_memory)
    source = tmp_path / "in.txt"
    source.write_text("haus\n")
    assert main(["translate", "--engine", "ctranslate2", "--checkpoint", str(exported),
                 "--input", str(source)]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: cannot load the CTranslate2 model in {exported}: CUDA failed with "
                   "error out of memory; free memory on the device, or decode on another device\n")


def damaged_copy(exported: Path, broken: Path, damage: str) -> Path:
    """A copy of an export with ``damage`` (model.bin cut short, or config.json not JSON)."""
    shutil.copytree(exported, broken)
    if damage == "model.bin":
        (broken / damage).write_bytes((exported / damage).read_bytes()[:1000])
    else:
        (broken / damage).write_text("{not json")
    return broken


@pytest.mark.parametrize("damage", ["model.bin", "config.json"])
def test_a_damaged_export_is_refused_before_the_server_starts(exported, tmp_path, capsys,
                                                              monkeypatch, damage):
    """As a run's weights that do not load: it failed in the worker, with a traceback in the
    log and then "the server could not start" without why."""
    litserve = pytest.importorskip("litserve")
    broken = damaged_copy(exported, tmp_path / "broken.ct2", damage)
    monkeypatch.setattr(litserve.LitServer, "run", lambda self, **options: None)  # never starts
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    assert main(["serve", "--engine", "ctranslate2", "--checkpoint", str(exported), str(broken),
                 "--port", port]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot load the CTranslate2 model in {broken}: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("damage", ["model.bin", "config.json"])
def test_a_damaged_export_is_a_one_line_error(exported, tmp_path, capsys, damage):
    broken = damaged_copy(exported, tmp_path / "broken.ct2", damage)
    source = tmp_path / "in.txt"
    source.write_text("haus\n")
    assert main(["translate", "--engine", "ctranslate2", "--checkpoint", str(broken),
                 "--input", str(source)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot load the CTranslate2 model in {broken}: ")
    assert err.count("\n") == 1
