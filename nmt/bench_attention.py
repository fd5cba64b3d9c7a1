"""``nmt bench attention``: each attention scorer alone, forward and backward, as the source
and target length grows, one fresh process per point (its peak memory its own). This module
imports torch and the scorers alone: each point's process is forked from a server that has
imported it once (``point_processes``)."""

from __future__ import annotations

import math
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import torch

from nmt.attention import SCORERS, build_scorer
from nmt.memory import limit_data_growth, peak_memory_mb


def _time_scorer(name: str, length: int, batch: int, heads: int, head_dim: int,
                 repeats: int, threads: int, memory_limit_mb: float | None = None) -> dict:
    """Runs in a fresh process: forward+backward time and the peak memory it adds, on
    ``threads`` threads (the bench's: a forked process has its server's). With
    ``memory_limit_mb`` the process may allocate at most that much more (a failed allocation,
    not the kernel's OOM killer, then ends a point that does not fit)."""
    torch.set_num_threads(threads)
    if memory_limit_mb is not None:
        torch.ones(1 << 20).mul_(2).sum()  # start the thread pool first: its stacks count too
        limit_data_growth(memory_limit_mb)
    torch.manual_seed(0)
    scorer = build_scorer(name, head_dim, head_dim, head_dim)

    def inputs(n: int) -> list[torch.Tensor]:  # q, k, v: (batch, heads, n, head_dim)
        return [torch.randn(batch, heads, n, head_dim, requires_grad=True) for _ in range(3)]

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        context, _ = scorer.attend(q, scorer.prepare_keys(k), v, None, need_weights=False)
        context.sum().backward()

    # The kernels' code first, at length 2: the pages of torch's library it touches count in
    # the resident memory once read (6-8 MB in a spawned process, more in a forked one), not as
    # the scorer's.
    step(*inputs(2))
    q, k, v = inputs(length)
    before = peak_memory_mb()
    step(q, k, v)  # warm-up; also reaches this size's peak memory
    peak = peak_memory_mb() - before
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(q, k, v)
        times.append(time.perf_counter() - start)
    return {"scorer": name, "length": length, "ms": round(1000 * min(times), 3),  # best of N
            "peak_mb": round(max(peak, 0.0), 1)}


def growth_exponent(lengths: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(length): value ~ length^slope."""
    xs, ys = [math.log(x) for x in lengths], [math.log(max(y, 1e-9)) for y in values]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


RSS_RESOLUTION_MB = 32.0  # a smaller rise of the peak RSS is the allocator's reuse, not growth


def scorer_exponents(rows: list[dict]) -> dict[str, dict[str, float | None]]:
    """Per scorer, the growth exponents of time and peak memory over the longer half of the
    lengths (at least two points), where the (T, S) terms dominate fixed costs. The memory
    exponent is None where a peak in that half is under RSS_RESOLUTION_MB: a process's peak
    RSS does not see allocations that fit in memory it already holds."""
    exponents = {}
    for name in dict.fromkeys(r["scorer"] for r in rows):
        mine = [r for r in rows if r["scorer"] == name]
        tail = mine[-max(2, len(mine) // 2):]
        if len(tail) < 2:
            continue
        lengths = [r["length"] for r in tail]
        peaks = [r["peak_mb"] for r in tail]
        exponents[name] = {
            "time": round(growth_exponent(lengths, [r["ms"] for r in tail]), 2),
            "memory": round(growth_exponent(lengths, peaks), 2)
            if min(peaks) >= RSS_RESOLUTION_MB else None}
    return exponents


def point_processes() -> multiprocessing.context.BaseContext:
    """How a point's fresh process starts: forked from a server process that imported this
    module (torch, the scorers) once, as each spawned process did anew (1-2 s a point on a
    Zen 3: 42 points at the default --max-len); spawned where there is no fork server."""
    if "forkserver" not in multiprocessing.get_all_start_methods():  # Windows
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # where a fork server runs already: no effect
    return context


def _time_point(*args, measure=_time_scorer) -> dict:
    """``measure(*args)`` in a fresh process (so that its peak memory is its own); a point that
    runs out of memory, or whose process dies (the OOM killer), is a row with an error."""
    name, length = args[:2]
    try:
        with ProcessPoolExecutor(1, mp_context=point_processes()) as pool:
            return pool.submit(measure, *args).result()
    except BrokenProcessPool:  # (a RuntimeError too)
        why = "its process died"
    except (MemoryError, RuntimeError) as error:
        if isinstance(error, RuntimeError) and "allocate" not in str(error):
            raise
        why = "out of memory"
    return {"scorer": name, "length": length, "ms": None, "peak_mb": None, "error": why}


def bench_attention(max_len: int = 1024, batch: int = 2, heads: int = 4, head_dim: int = 32,
                    repeats: int = 3, plot: str | None = None,
                    memory_limit_mb: float | None = None) -> dict:
    """Each scorer alone, T = S = 16 .. max_len: time and peak memory, one process per point
    so that each peak is its own, and their growth exponents (``scorer_exponents``) over the
    points that fit in memory; a scorer's first point that does not is its last row. The
    summary names the CPU (model, family and model numbers, bf16 flags) and the precision
    (fp32: torch's default dtype, which the points' tensors take)."""
    from nmt.precision import cpu_identity  # here: nmt.config is not for the points' processes

    lengths = [2**i for i in range(4, int(math.log2(max_len)) + 1)]
    rows = []
    for name in SCORERS:
        for n in lengths:
            rows.append(_time_point(name, n, batch, heads, head_dim, repeats,
                                    torch.get_num_threads(), memory_limit_mb))
            if "error" in rows[-1]:  # a longer length would not fit either
                break
    measured = [r for r in rows if "error" not in r]
    exponents = scorer_exponents(measured)
    if plot:
        from nmt.plots import save_lines  # here: matplotlib is not for the points' processes

        save_lines(plot, {name: ([r["length"] for r in measured if r["scorer"] == name],
                                  [r["ms"] for r in measured if r["scorer"] == name]) for name in SCORERS},
                    "source = target length", "forward + backward (ms)",
                    f"Attention scorers alone (batch {batch}, {heads} heads, d {head_dim})",
                   loglog=True)
    return {"bench": "attention", "batch": batch, "heads": heads, "head_dim": head_dim,
            "rows": rows, "exponents": exponents, "threads": torch.get_num_threads(),
            "device": f"CPU: {cpu_identity()}", "precision": "32-true"}
