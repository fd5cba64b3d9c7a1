"""Keep freed memory in the process instead of handing it back to the OS (glibc only).

glibc serves every allocation above 32 MB with a fresh ``mmap`` and returns it with
``munmap`` when freed. A training step allocates many such tensors (the (tokens, vocab)
logits, their fp32 copy and gradient are ~100 MB each), so each step page-faults the
same memory in again: a third of the Transformer step was kernel time. Turning ``mmap``
off and raising the trim threshold makes freed blocks reusable (PyTorch's CPU tuning
guide suggests jemalloc or tcmalloc for the same reason). Peak RSS grows by about a third.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters, from glibc's malloc.h


def keep_freed_memory() -> bool:
    """Set glibc's malloc to reuse freed memory; returns False where that is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
