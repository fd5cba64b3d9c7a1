"""What attention looks at: the recorder's statistics against hand computations, weights of
every kind from a teacher-forced pass, and the self-attention pictures of ``translate``."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nmt import plots
from nmt.attention import Scorer, build_scorer
from nmt.attention_stats import (
    AttentionRecorder,
    attention_layout,
    shape_model,
    teacher_forced_weights,
    translation_attention,
)
from nmt.cli import main
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NMTError
from nmt.translator import Translator

from .conftest import TINY, tiny_model
from .test_cli import corpus, run  # noqa: F401  (module-scoped fixtures: a tiny trained run)


class OneCrossAttention(nn.Module):
    """A model whose only attention is one dot scorer called "scorer" (a cross-attention)."""

    def __init__(self, dim: int = 2):
        super().__init__()
        self.scorer = build_scorer("dot", dim, dim, dim)

    def forward(self, query, keys, mask):
        return self.scorer.attend(query, keys, keys, mask)


def test_recorder_statistics_match_a_hand_computation():
    model = OneCrossAttention()
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]])  # (B=1, S=3, 2)
    query = torch.tensor([[[2.0, 0.0], [0.0, 0.0]]])  # (1, T=2, 2): rows 0 and 1, row 1 is pad
    mask = torch.tensor([[[True, True, False]]])  # the third key is padding
    with AttentionRecorder(model) as recorder:
        recorder.start_batch(torch.ones(1, 3, dtype=torch.bool), torch.tensor([[True, False]]))
        model(query, keys, mask)
    # Row 0: logits (2, 0) over the two real keys -> std 1, weights softmax(2, 0).
    p = torch.softmax(torch.tensor([2.0, 0.0]), 0)
    entropy = float(-(p * p.log()).sum())
    # Diagonal of row 0 of T=1 real target over S=2 real keys: centre 0.5, both within the band.
    stats = recorder.stats()
    assert stats == {"cross": {"logit_std": 1.0, "entropy": round(entropy, 4), "diagonal_mass": 1.0}}
    assert "attend" not in vars(model.scorer)  # the scorer's own method is back


def test_diagonal_mass_counts_only_the_band_around_the_scaled_diagonal():
    """T = 2 target rows over S = 8 source keys: the diagonal's centres are j = (i + 1/2) S/T
    - 1/2 = 1.5 and 5.5. Row 0 looks at key 7 (5.5 away: outside the band of 2), row 1 at key
    5 (0.5 away: inside), each with all its weight: the mean mass is 1/2."""
    model = OneCrossAttention(dim=8)
    keys = torch.eye(8).unsqueeze(0)  # (1, S=8, 8): key j is the j-th unit vector
    query = 50 * torch.stack([torch.eye(8)[7], torch.eye(8)[5]]).unsqueeze(0)  # (1, T=2, 8)
    with AttentionRecorder(model) as recorder:
        recorder.start_batch(torch.ones(1, 8, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool))
        model(query, keys, torch.ones(1, 1, 8, dtype=torch.bool))
    assert recorder.stats()["cross"]["diagonal_mass"] == 0.5


def test_every_scorer_is_seen_and_released():
    model = tiny_model("transformer", "additive")
    scorers = [m for m in model.modules() if isinstance(m, Scorer)]
    with AttentionRecorder(model) as recorder:
        assert all("attend" in vars(s) for s in scorers)
        assert sorted({kind for kind, _ in recorder.scorers}) == ["cross", "decoder", "encoder"]
    assert not any("attend" in vars(s) for s in scorers)


@pytest.mark.parametrize("family", ["rnn", "transformer"])
@pytest.mark.parametrize("src,tgt", [([5, 6, 7, 8], [9, 10]), ([5, 6], [9, 10, 11, 12])])
def test_teacher_forced_weights_shapes_and_causality(family, src, tgt):
    """Shapes hold whichever side is longer (S and T include EOS)."""
    model = tiny_model(family, "scaled_dot")
    weights = teacher_forced_weights(model, src, tgt)
    s, t = len(src) + 1, len(tgt) + 1
    layers, heads = (1, 1) if family == "rnn" else (2, 4)
    assert weights["cross"].shape == (layers, heads, t, s)
    torch.testing.assert_close(weights["cross"].sum(-1), torch.ones(layers, heads, t))
    if family == "rnn":
        assert set(weights) == {"cross"}
    else:
        assert weights["encoder"].shape == (2, 4, s, s)
        assert weights["decoder"].shape == (2, 4, t, t)
        assert torch.all(weights["decoder"].triu(1) == 0)  # no peeking at later positions


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_attention_layout_is_known_before_decoding(family):
    """attention_layout reads from the model the (layers, heads) the weights then have, and
    from the same config's shape_model (no weights) the same."""
    model = tiny_model(family, "scaled_dot")
    weights = teacher_forced_weights(model, [5, 6, 7], [9, 10])
    shapes = shape_model({**TINY[family], "attention": "scaled_dot"})
    for kind in weights:
        assert attention_layout(model, kind) == attention_layout(shapes, kind) == \
            tuple(weights[kind].shape[:2])
    if family == "rnn":
        with pytest.raises(NMTError, match="no encoder self-attention"):
            attention_layout(model, "encoder")
    assert attention_layout(None, "cross") == (1, 1)  # CTranslate2: one map
    with pytest.raises(NMTError, match="needs the torch engine"):
        attention_layout(None, "decoder")


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_self_attention_pictures_have_shape_and_labels(run, tmp_path, monkeypatch, kind):
    drawn = []
    monkeypatch.setattr(plots, "save_attention_grid", lambda path, panels, **_: drawn.append((path, panels)))
    source = tmp_path / "in.txt"
    source.write_text("haus mann katze\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                 "--plot-attention", str(tmp_path / "pics"), "--attention-kind", kind,
                 "--attention-head", "all", "--beam", "1"]) == 0
    (path, panels), = drawn
    assert path.name == "0001.png" and len(panels) == 2  # the tiny run has 2 heads
    translator = Translator.from_run_dir(run)
    best = translator.translate(["haus mann katze"], 1)[0][0]
    source_pieces = translator.tokenizer.pieces(translator.encode_lines(["haus mann katze"])[0]) + ["</s>"]
    assert [title for title, *_ in panels] == [f"line 1, {kind}, head {h}" for h in (0, 1)]
    for _, weights, columns, rows in panels:
        if kind == "encoder":
            assert columns == rows == source_pieces
        else:
            assert rows == best.pieces + ["</s>"] and columns == ["<s>"] + best.pieces
            assert torch.all(weights.triu(1) == 0)
        assert weights.shape == (len(rows), len(columns))
        torch.testing.assert_close(weights.sum(-1), torch.ones(len(rows)))


def test_a_truncated_lines_picture_warns_once(run, tmp_path, monkeypatch, capsys):
    """The self-attention's teacher-forced pass encodes the line again: its truncation was said
    twice."""
    monkeypatch.setattr(plots, "save_attention_grid", lambda *args, **kwargs: None)
    source = tmp_path / "in.txt"
    limit = Translator.from_run_dir(run).max_positions
    source.write_text("haus mann katze " * limit + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                 "--plot-attention", str(tmp_path / "pics"), "--attention-kind", "encoder",
                 "--beam", "1"]) == 0
    assert capsys.readouterr().err.count("warning: line 1 has ") == 1


def test_a_greedy_translation_is_the_same_with_its_attention(run):
    """Beam 1 is greedy search whether the attention is drawn or not (the web page asks for it,
    the API need not), so both give one translation with one score."""
    translator = Translator.from_run_dir(run)
    lines = ["haus mann", "katze blau im park", "der hund spielt"]
    plain = [hyps[0] for hyps in translator.translate(lines, 1)]
    drawn = [hyps[0] for hyps in translator.translate(lines, 1, need_attn=True)]
    assert [(t.text, t.score, t.length_penalty) for t in drawn] == [
        (t.text, t.score, 1.0) for t in plain]
    assert all(t.attention.shape[0] == len(t.pieces) + 1 for t in drawn)


def test_rnn_has_no_self_attention_to_draw(run):
    trained = Translator.from_run_dir(run)
    rnn = tiny_model("rnn", "additive", vocab=len(trained.tokenizer))
    translator = Translator(rnn, Tokenizer(run / "spm.model"), trained.config)
    best = translator.translate(["haus mann"], 2, need_attn=True)[0][0]
    assert translation_attention(translator, "haus mann", best, "cross")[0].shape[:2] == (1, 1)
    with pytest.raises(NMTError, match="no encoder self-attention"):
        translation_attention(translator, "haus mann", best, "encoder")
    assert math.isfinite(best.score)


# The picture options and folder are checked before the model loads, against the layout the
# run's config builds (--attention-layer 5 of a one-layer model was refused only once the model
# had loaded and --precision auto had timed it: seconds, more for an ensemble; a folder that
# cannot be made, under a file, too)
@pytest.mark.parametrize("options,message", [
    (["--attention-layer", "5"], "no attention layer 5 / head mean in this model: it has 1 layer and 2"),
    (["--attention-kind", "encoder", "--attention-head", "2"], "no attention layer -1 / head 2"),
    (["--attention-kind", "decoder", "--attention-head", "3"], "no attention layer -1 / head 3"),
    (["--attention-head", "first"], "--attention-head must be mean, all or a head number"),
    # a digit to str.isdigit, not to int(): a ValueError traceback
    (["--attention-head", "\u00b2"], "--attention-head must be mean, all or a head number"),
    (["--plot-attention", "in.txt/pics"], "--plot-attention in.txt/pics: cannot make a folder there"),
])
def test_bad_attention_options_fail_at_once(run, tmp_path, monkeypatch, capsys, options, message):
    """A picture option or folder that cannot work fails at once, with one line, before the
    model loads; a bad layer or head names the ones there."""
    def too_late(*args, **kwargs):
        raise AssertionError("reached Translator.from_run_dir before the options were checked")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Translator, "from_run_dir", too_late)
    (tmp_path / "in.txt").write_text("haus mann katze\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(run), "--input", "in.txt", "--plot-attention",
                 "pics", *options, "--beam", "1"]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "pics").exists()


@pytest.mark.parametrize("output", [[], ["--output", "out.txt"]])
def test_a_model_that_fails_to_load_leaves_no_picture_folder(run, tmp_path, monkeypatch, capsys,
                                                             output):
    """The folder is made before the model loads: a load that fails takes the folders made for
    the pictures with it, also where the translations go to stdout (which keeps pictures)."""
    def damaged(*args, **kwargs):
        raise NMTError("cannot load best.ckpt")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Translator, "from_run_dir", damaged)
    (tmp_path / "in.txt").write_text("haus mann katze\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(run), "--input", "in.txt", *output,
                 "--plot-attention", "new/pics"]) == 1
    assert capsys.readouterr().err == "error: cannot load best.ckpt\n"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("option", [["--attention-layer", "0"], ["--attention-head", "all"],
                                    ["--attention-kind", "encoder"]])
def test_attention_options_without_a_picture_folder_are_refused(run, tmp_path, monkeypatch, capsys,
                                                                 option):
    """A picture option without --plot-attention would draw nothing: one line, before the
    translator is even opened, and no output file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Translator, "from_run_dir", None)  # opening it would be a TypeError
    (tmp_path / "in.txt").write_text("haus mann katze\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(run), "--input", "in.txt", "--output", "out.txt",
                 *option]) == 1
    err = capsys.readouterr().err
    assert f"{option[0]} chooses what --plot-attention DIR draws" in err and err.count("\n") == 1
    assert not (tmp_path / "out.txt").exists()


def test_alignment_takes_the_layer_and_head_options(run, tmp_path, capsys):
    """--attention-layer and --attention-head choose the cross-attention --alignment reads
    (they were refused without --plot-attention): the rows are that map's."""
    from nmt.alignment import aligned

    (tmp_path / "in.txt").write_text("haus mann katze\nhund blau im park\n", encoding="utf-8")
    command = ["translate", "--checkpoint", str(run), "--input", str(tmp_path / "in.txt"),
               "--beam", "1", "--precision", "32-true", "--alignment"]
    assert main([*command, "--attention-layer", "0", "--attention-head", "1",
                 "--attention-kind", "cross"]) == 0  # the map the pairs read: accepted
    rows = [row.split(" ||| ")[1] for row in capsys.readouterr().out.splitlines()]
    translator = Translator.from_run_dir(run, precision="32-true")
    lines = ["haus mann katze", "hund blau im park"]
    best = [hyps[0] for hyps in translator.translate(lines, 1, need_attn=True)]
    assert rows == [aligned(t, line, translator.tokenizer, 0, "1")
                    for line, t in zip(lines, best)]


@pytest.mark.parametrize("options,message", [
    (["--attention-layer", "5"], "no attention layer 5 / head mean in this model"),
    # more digits than int() takes (a traceback before), repeated shortened
    (["--attention-head", "9" * 5000], f"no attention layer -1 / head {'9' * 57}... in this model"),
    (["--attention-head", "1\n2"], "must be mean, all or a head number, got '1\\n2'"),  # one line
    (["--attention-head", "all"], "--attention-head all draws one panel per head, for --plot-attention"),
    (["--attention-kind", "encoder"], "--alignment always reads the cross-attention"),
    (["--attention-kind", "decoder", "--plot-attention", "pics"], "--alignment always reads the cross"),
])
def test_alignment_options_that_cannot_work_fail_at_once(run, tmp_path, monkeypatch, capsys,
                                                          options, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Translator, "from_run_dir", None)  # opening it would be a TypeError
    (tmp_path / "in.txt").write_text("haus mann katze\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(run), "--input", "in.txt", "--alignment",
                 *options]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_attention_panels_name_their_layer_and_head():
    from nmt.plots import attention_panels

    weights = torch.rand(3, 2, 4, 5)  # (layers, heads, T, S)
    mean = attention_panels(weights, "line 1, cross", -1, "mean")
    assert [t for t, _ in mean] == ["line 1, cross, layer 2, mean of heads"]
    torch.testing.assert_close(mean[0][1], weights[2].mean(0))
    every = attention_panels(weights, "line 1, cross", 0, "all")
    assert [t for t, _ in every] == ["line 1, cross, layer 0, head 0", "line 1, cross, layer 0, head 1"]
    with pytest.raises(NMTError, match="it has 3 layers and 2 heads"):
        attention_panels(weights, "line 1, cross", 3, "mean")
    one = torch.rand(1, 1, 4, 5)  # an RNN's attention, or CTranslate2's mean of the last layer
    assert [t for t, _ in attention_panels(one, "line 1, cross", -1, "all")] == ["line 1, cross"]
    with pytest.raises(NMTError, match="one attention map"):
        attention_panels(one, "line 1, cross", 2, "mean")


def test_every_head_of_a_long_line_draws_a_grid_of_bounded_size(monkeypatch):
    """--attention-head all on a 16-head model and a long line: 4 x 4 panels, each capped at
    16 in, drew a figure of 64 in (7,000 pixels) a side. The grid as a whole is capped; its
    panels name fewer pieces, each still at its own column."""
    saved = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, key: saved.append(fig))
    src, tgt = [f"s{i}" for i in range(1024)], [f"t{i}" for i in range(200)]
    panels = [(f"head {h}", torch.rand(len(tgt), len(src)), src, tgt) for h in range(16)]
    plots.save_attention_grid("unused.png", panels)
    (fig,) = saved
    assert max(fig.get_size_inches()) <= plots.FIGURE_INCHES
    across = [(int(x), label.get_text()) for x, label in
              zip(fig.axes[0].get_xticks(), fig.axes[0].get_xticklabels())]
    assert 10 < len(across) and all(src[x] == text for x, text in across)
    plots.plt.close(fig)


def test_a_long_line_draws_a_picture_of_bounded_size_with_its_own_labels(monkeypatch):
    """A line of 1,023 pieces (what translate keeps of a long one) drew a heatmap 25,000
    pixels a side: 2.3 GB for one image, a MemoryError traceback, or the process killed. The
    side is capped; the pieces named are every n-th, each at its own row or column."""
    saved = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, key: saved.append(fig))
    src = [f"s{i}" for i in range(1024)]
    tgt = [f"t{i}" for i in range(10)]
    plots.save_attention_grid("unused.png", [("line 1, cross", torch.rand(len(tgt), len(src)), src, tgt)])
    (fig,) = saved
    width, height = fig.get_size_inches()
    assert width <= plots.PANEL_INCHES[1] and height <= plots.PANEL_INCHES[1]
    (ax,) = fig.axes
    across = [(int(x), label.get_text()) for x, label in zip(ax.get_xticks(), ax.get_xticklabels())]
    down = [(int(y), label.get_text()) for y, label in zip(ax.get_yticks(), ax.get_yticklabels())]
    assert 10 < len(across) < len(src) and all(src[x] == text for x, text in across)
    assert down == list(enumerate(tgt))  # the short axis keeps every label
    step = across[1][0]
    assert ax.get_title() == f"line 1, cross (pieces named: 1 in {step} across, 1 in 1 down)"
    plots.plt.close(fig)
    # A short line is drawn as before: one label per piece, a side of 0.22 in per piece
    plots.save_attention_grid("unused.png", [("short", torch.rand(3, 4), src[:4], tgt[:3])])
    assert saved[-1].get_size_inches().tolist() == [3.0, 3.0]
    assert [t.get_text() for t in saved[-1].axes[0].get_xticklabels()] == src[:4]
    assert saved[-1].axes[0].get_title() == "short"
    plots.plt.close(saved[-1])


def test_a_grid_is_drawn_again_only_where_what_it_shows_or_what_draws_it_changed(tmp_path,
                                                                                monkeypatch):
    """nmt compare --tables-only redrew every attention grid of the study from unchanged
    records, most of its time. A PNG names the key it was drawn from; the same panels by the
    same code and matplotlib keep it, any change draws it again."""
    src, tgt = ["ein", "hund", "."], ["a", "dog"]
    weights = torch.rand(len(tgt), len(src))
    path = tmp_path / "grid.png"

    def drawn(shown: torch.Tensor, title: str = "line 1, cross") -> bool:
        """Whether save_attention_grid wrote the picture (a new file replaces the old one)."""
        before = path.stat().st_ino if path.exists() else None
        plots.save_attention_grid(path, [(title, shown, src, tgt), None], columns=2)
        return path.stat().st_ino != before

    assert drawn(weights) and plots.drawn_from(path) is not None
    assert not drawn(weights.clone())  # the same values
    assert drawn(weights.flip(0)) and drawn(weights.flip(0), "line 2, cross")
    assert drawn(weights.flip(0)[:, :2], "line 2, cross")  # the same values in another shape
    monkeypatch.setattr(plots.matplotlib, "__version__", "0.0")  # another matplotlib
    assert drawn(weights.flip(0)) and not drawn(weights.flip(0))
    path.write_bytes(b"not a picture")
    assert plots.drawn_from(path) is None and drawn(weights.flip(0))
    # another format has no key: drawn every time, as before
    other = tmp_path / "grid.pdf"
    for _ in range(2):
        before = other.stat().st_ino if other.exists() else None
        plots.save_attention_grid(other, [("line 1, cross", weights, src, tgt)])
        assert other.stat().st_ino != before and other.read_bytes().startswith(b"%PDF")
    assert plots.drawn_from(other) is None


def test_the_key_size_of_a_family_without_cross_attention_is_one_line(monkeypatch):
    """A family may attend to nothing: its d_k was a StopIteration traceback, not an error."""
    from nmt import models
    from nmt.attention_stats import attention_key_size

    class Plain(torch.nn.Module):
        def __init__(self, vocab_size: int, dim: int = 4):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab_size, dim)

        encode = init_state = decode_step = set_dropout = lambda self, *args: None

    monkeypatch.setitem(models.MODELS, "plain", Plain)
    with pytest.raises(NMTError, match="^model family 'plain' has no cross-attention scorer$"):
        attention_key_size({"family": "plain"})


def test_a_heatmaps_title_is_drawn_inside_its_picture(tmp_path, monkeypatch):
    """Laid out at matplotlib's 100 dpi and saved at 110, a line of pieces along the top put
    the title above the figure's edge: ``translate --plot-attention`` of an untrained run's
    36-piece output wrote a picture without its "line 1, cross"."""
    closed = []
    monkeypatch.setattr(plots.plt, "close", closed.append)  # the figure as written, kept
    src = "▁Ein ▁Mann ▁mit ▁eine m ▁orange farbene n ▁Hut , ▁ ▁der ▁etwas ▁an sta r rt . </s>".split()
    tgt = ("▁Drei ▁Bo ften sc radfahr" + " ▁Junge ▁Hintergrund zer ▁Telefon ▁bea ▁flieg gew ▁j" * 3
           + " ennis ommuni </s>").split()
    weights = torch.rand(len(tgt), len(src))
    plots.save_attention_grid(tmp_path / "0001.png", [("line 1, cross", weights, src, tgt)])
    (fig,) = closed
    title = fig.axes[0].title.get_window_extent(fig.canvas.get_renderer())
    assert 0 <= title.y0 and title.y1 <= fig.bbox.height, (title, fig.bbox)
    assert (tmp_path / "0001.png").is_file()
    monkeypatch.undo()
    plots.plt.close(fig)
