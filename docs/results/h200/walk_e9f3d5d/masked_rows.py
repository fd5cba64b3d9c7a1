"""Does torch's fused attention on CUDA give a query whose mask hides every key zero weights and a
zero context, as the explicit path does (nmt/attention.py, Scorer.attend)? And no NaN in the grads."""
import torch

from nmt.attention import ScaledDotScorer

torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
scorer = ScaledDotScorer(64, 64, 64).to(dev).eval()
B, H, T, S, D = 3, 4, 7, 9, 64
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    q, k, v = (torch.randn(B, H, n, D, device=dev, dtype=dtype) for n in (T, S, S))
    mask = torch.ones(B, 1, T, S, dtype=torch.bool, device=dev)
    mask[0, :, 2] = False       # one query row hides every key
    mask[1, :, :, 5:] = False   # key padding
    mask[2] = False             # a whole sentence hidden
    outs = {}
    for weights in (True, False):
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        ctx, _ = scorer.attend(qq, kk, vv, mask, need_weights=weights)
        ctx.float().square().sum().backward()
        nan_grad = any(bool(x.grad.isnan().any()) for x in (qq, kk, vv))
        outs[weights] = (ctx.detach().float(), nan_grad)
    (exp, nan_e), (fus, nan_f) = outs[True], outs[False]
    hidden = ~mask.any(-1)  # (B, 1, T)
    print(f"{dev} {dtype}: fused NaN {bool(fus.isnan().any())}, grad NaN fused {nan_f} explicit {nan_e}, "
          f"fused |ctx| on hidden rows {fus.permute(0, 2, 1, 3)[hidden.squeeze(1)].abs().max().item():.3g}, "
          f"max |fused - explicit| {(fus - exp).nan_to_num(1e9).abs().max().item():.3g}")
