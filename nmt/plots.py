"""Pictures with matplotlib: attention heatmaps and the charts of ``compare`` and ``bench``."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)
from torch import Tensor  # noqa: E402

from nmt.attention_stats import check_attention_choice, translation_attention  # noqa: E402
from nmt.errors import NMTError  # noqa: E402
from nmt.files import atomic_path  # noqa: E402

INCHES_PER_PIECE = 0.22  # a 7-point label's row or column
PANEL_INCHES = (3.0, 16.0)  # a heatmap's smallest and largest side
# A grid's largest side, wherever its panels allow: 16 heads of long lines drew 4 x 4 panels of
# 16 in, 7,000 pixels a side (the study's largest grid, 9 panels across, is 37 in)
FIGURE_INCHES = 48.0
DPI = 110  # pixels per inch of the pictures written
DRAWN_FROM = "nmt-drawn-from"  # a PNG's text field: the key of what it was drawn from


def draw_attention(ax, weights: Tensor, src: list[str], tgt: list[str], title: str = "",
                   labels: int | None = None) -> None:
    """Heatmap of (T, S) weights: target pieces down the side, source pieces along the top.
    An axis with more pieces than ``labels`` (what fits) names every n-th piece, at its own
    row or column, and the title says which."""
    ax.imshow(weights.float().cpu().numpy(), cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    across, down = (max(1, math.ceil(len(pieces) / labels)) if labels else 1 for pieces in (src, tgt))
    ax.set_xticks(range(0, len(src), across), src[::across], rotation=90, fontsize=7)
    ax.set_yticks(range(0, len(tgt), down), tgt[::down], fontsize=7)
    ax.xaxis.tick_top()
    if (across, down) != (1, 1):
        thinned = f"pieces named: 1 in {across} across, 1 in {down} down"
        title = f"{title} ({thinned})" if title else thinned
    ax.set_title(title, fontsize=9, pad=40)


def panel_layout(longest: int, large: float = PANEL_INCHES[1]) -> tuple[float, int | None]:
    """A heatmap's side in inches for ``longest`` pieces on an axis, and how many labels fit
    on an axis where that side is capped at ``large`` (None: all of them): the largest side
    holds fewer labels, not a larger picture (a line of 1,000 pieces drew 25,000 pixels a
    side, gigabytes to render, and its process was killed)."""
    size = max(PANEL_INCHES[0], INCHES_PER_PIECE * longest + 1.5)
    if size <= large:
        return size, None
    return large, int((large - 1.5) / INCHES_PER_PIECE)


def save_attention_grid(path: str | Path, panels: list[tuple[str, Tensor, list[str], list[str]] | None],
                        columns: int = 4) -> None:
    """One figure with a heatmap per panel (title, weights (T, S), source, target pieces);
    a None panel leaves its place empty (to start a new row). A PNG drawn from the same panels
    by the same code is kept, not drawn again: ``nmt compare --tables-only`` redrew the
    study's unchanged grids each time, most of its time."""
    key = drawing_key(panels, columns) if Path(path).suffix.lower() == ".png" else None
    if key is not None and drawn_from(path) == key:
        return
    rows = math.ceil(len(panels) / columns)
    columns = min(columns, len(panels))
    longest = max(max(len(p[2]), len(p[3])) for p in panels if p is not None)
    # each panel's share of the figure's largest side, not below the smallest panel
    large = max(PANEL_INCHES[0], min(PANEL_INCHES[1], FIGURE_INCHES / max(rows, columns)))
    size, labels = panel_layout(longest, large)
    fig, axes = plt.subplots(rows, columns, figsize=(size * columns, size * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, panel in zip(axes.flat, panels):
        if panel is None:
            ax.axis("off")
        else:
            draw_attention(ax, panel[1], panel[2], panel[3], panel[0], labels)
    _save(fig, path, key)


def drawing_key(*shown) -> str:
    """A hash of what a grid shows (``_tensor_digest``) and of what draws it: the drawing
    functions' code, the sizes above and matplotlib's version. Not the whole module's code: an
    edit elsewhere in it would draw the committed study's grids again, pixel for pixel."""
    code = _drawing_code()
    sizes = [INCHES_PER_PIECE, PANEL_INCHES, FIGURE_INCHES, DPI, DRAWN_FROM]
    what = json.dumps([code, sizes, matplotlib.__version__, shown], default=_tensor_digest)
    return hashlib.sha256(what.encode()).hexdigest()[:16]


@functools.cache
def _drawing_code() -> list[str]:
    """The source of the functions that draw a grid, read from their file once, not per grid."""
    return [inspect.getsource(f) for f in (save_attention_grid, panel_layout, draw_attention, _save)]


def _tensor_digest(tensor: Tensor) -> str:
    """A tensor in a key: its shape and float32 bytes, as ``draw_attention`` draws it (as JSON
    numbers, a 16-head grid of a long line took seconds to key)."""
    values = tensor.detach().float().cpu().contiguous().numpy().tobytes()
    return f"{tuple(tensor.shape)} {hashlib.sha256(values).hexdigest()}"


def drawn_from(path: str | Path) -> str | None:
    """The key a PNG picture was drawn from (``drawing_key``); None where there is none, or no
    picture."""
    try:
        with Image.open(path) as image:
            return image.info.get(DRAWN_FROM)
    except (OSError, SyntaxError, ValueError):  # no file, or not a PNG: PIL's errors
        return None


def attention_panels(weights: Tensor, title: str, layer: int, head: str) -> list[tuple[str, Tensor]]:
    """(title, (T, S) weights) per panel: ``layer``'s mean over heads, one head, or each head.
    An RNN, and CTranslate2 (the last layer's mean over heads), give one map: (1, 1, T, S)."""
    layers, heads = weights.shape[:2]
    check_attention_choice(layers, heads, layer, head)
    if (layers, heads) == (1, 1):
        return [(title, weights[0, 0])]
    per_head = weights[layer]  # (H, T, S)
    where = f"{title}, layer {layer % layers}, " if layers > 1 else f"{title}, "
    if head == "mean":
        return [(where + "mean of heads", per_head.mean(0))]
    chosen = range(heads) if head == "all" else [int(head)]
    return [(where + f"head {h}", per_head[h]) for h in chosen]


def plot_attention(translator, lines: list[str], results, folder: str | Path, kind: str, layer: int,
                   head: str, first_line: int = 1) -> None:
    """One heatmap PNG per input line (its best translation): <folder>/<line number>.png
    (``lines[0]`` is line ``first_line``), of the cross-attention or (Transformer) the encoder
    or decoder self-attention. ``nmt.attention_stats.attention_layout`` tells which ``kind``,
    ``layer`` and ``head`` exist."""
    for number, (line, hyps) in enumerate(zip(lines, results), start=first_line):
        best = hyps[0]
        if best.attention is None:  # empty input line: nothing to draw
            continue
        weights, rows, columns = translation_attention(translator, line, best, kind)  # (L, H, T, S)
        panels = attention_panels(weights, f"line {number}, {kind}", layer, head)
        save_attention_grid(Path(folder) / f"{number:04d}.png",
                            [(title, w, columns, rows) for title, w in panels])


def save_bar_chart(path: str | Path, labels: list[str], means: list[float], stds: list[float],
                   ylabel: str, title: str) -> None:
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(labels) + 2), 4))
    ax.bar(range(len(labels)), means, yerr=stds, capsize=4, color="#4c72b0")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(fig, path)


def save_scatter(path: str | Path, xs: list[float], ys: list[float], labels: list[str],
                 xlabel: str, ylabel: str, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter(xs, ys, color="#dd8452")
    for x, y, label in zip(xs, ys, labels):
        ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(fig, path)


def save_lines(path: str | Path, series: dict[str, tuple[list[float], list[float]]],
               xlabel: str, ylabel: str, title: str, loglog: bool = False) -> None:
    """One line per named series of (xs, ys); log-log axes on request."""
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, (xs, ys) in series.items():
        (ax.loglog if loglog else ax.plot)(xs, ys, marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    _save(fig, path)


def save_line_panels(path: str | Path, panels: list[tuple[str, dict[str, tuple[list, list]]]],
                     xlabel: str, title: str, log_x: bool = False) -> None:
    """Side-by-side panels (y label, {series: (xs, ys)}) sharing the x axis."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (ylabel, series) in zip(axes[0], panels):
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", label=name)
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    _save(fig, path)


def check_picture_path(path: str | Path) -> None:
    """A one-line error, before any work, where matplotlib cannot write a picture named
    ``path`` (without a suffix it writes a PNG, so a folder's name would draw NAME.png)."""
    if Path(path).is_dir():
        raise NMTError(f"cannot draw a picture named {path}: it is a folder; name a file in it, "
                       f"e.g. {Path(path) / 'times.png'}")
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix and suffix not in formats:
        raise NMTError(f"cannot draw a picture named {path}: end its name with one of "
                       f"{', '.join('.' + name for name in sorted(formats))}")


def _save(fig, path: str | Path, key: str | None = None) -> None:
    """Lay ``fig`` out and write it at ``DPI``, whole or not at all (a PNG cut short, holding
    the ``key`` it was drawn from, would never be drawn again). Laid out at matplotlib's 100
    dpi and saved at 110, a heatmap's title could be drawn off the figure (a long line's pieces
    along the top: ``translate --plot-attention`` lost "line 1, cross"): the layout is made at
    the dpi saved."""
    path = Path(path)
    if not path.suffix:  # matplotlib's default format, named as matplotlib names it
        path = path.with_name(f"{path.name.rstrip('.')}.{plt.rcParams['savefig.format']}")
    fig.set_dpi(DPI)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=DPI, format=path.suffix[1:].lower(),
                        metadata=None if key is None else {DRAWN_FROM: key})
    finally:
        plt.close(fig)
