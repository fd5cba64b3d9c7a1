"""How much a new (batch, length) shape costs torch's fused attention on a GPU, with and
without the cuDNN backend: the measurement behind ``ScaledDotScorer.FUSED_BACKENDS``.

    python scripts/bench_sdpa_shapes.py        # needs a CUDA GPU

Each of 12 shapes near a translation batch's (B ~ 130 sentences, 4 heads of 64, T ~ S ~ 25)
runs forward + backward in bf16 with a key-padding mask, once new and once again. On an
NVIDIA H100 (torch 2.11): cuDNN 643 ms for a new shape, 0.52 ms again; without it 2.8 and
0.45 ms (docs/performance.md).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from nmt.errors import NMTError, run_script

HEADS, HEAD_DIM, SHAPES = 4, 64, [(128 + i, 20 + i, 22 + i) for i in range(12)]


def step_ms(batch: int, tgt_len: int, src_len: int) -> float:
    """One forward + backward of fused attention on fresh random inputs, in milliseconds."""
    q = torch.randn(batch, HEADS, tgt_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, HEADS, src_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    mask = torch.ones(batch, 1, 1, src_len, dtype=torch.bool, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    paragraphs = __doc__.split("\n\n")  # what it measures, how to run it, the shapes and results
    argparse.ArgumentParser(description=f"{paragraphs[0]} It needs a CUDA GPU.",
                            epilog=paragraphs[2]).parse_args()
    if not torch.cuda.is_available():
        raise NMTError("bench_sdpa_shapes.py times torch's fused attention on a CUDA GPU, and "
                       "torch sees none here")
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for cudnn in (True, False):
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
        new = [step_ms(*shape) for shape in SHAPES]
        again = [step_ms(*shape) for shape in SHAPES]
        print(f"cudnn_sdp={cudnn}: new shape {sum(new) / len(new):.2f} ms, "
              f"same shape again {sum(again) / len(again):.2f} ms")


if __name__ == "__main__":
    run_script(main)
