"""Where the Matryoshka time goes: the forward and gradient Triton kernels timed alone
(torch tensors, ``triton.testing.do_bench``, no JAX and no launcher glue), next to the
plain kernels, at B = 65536, D = 512, bf16, dims (64, 128, 256, 512). GPU only; run
it in a process without JAX (see run_device.sh).

  python benchmarks/bench_mrl_kernels.py
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

from memeff_jax.backends.triton.grad_bwd import _lse_bwd_kernel
from memeff_jax.backends.triton.stats_fwd import _tile_lse_fwd_kernel

B, D = 65536, 512
SEG4 = 1 | 2 << 16 | 4 << 32 | 8 << 48   # dims (64, 128, 256, 512) in 64-feature chunks
SCALE2 = 14.28 * 1.4426950408889634      # logit scale 1 / 0.07, in log2 units
F32 = dict(device="cuda", dtype=torch.float32)


def _inputs():
  torch.manual_seed(0)
  x = torch.nn.functional.normalize(torch.randn(B, D, device="cuda"), dim=1)
  y = torch.nn.functional.normalize(x + 0.5 * torch.randn(B, D, device="cuda"), dim=1)
  return x.to(torch.bfloat16), y.to(torch.bfloat16)


def forward(x, y, k, segs, bm, bn, warps, stages, two_sided=True, tables=True):
  """The tiled statistics kernel over all rows at once (one slab)."""
  col_tiles = B // bn
  row_part = torch.empty(k, col_tiles, B, **F32)
  col_part = torch.empty(k, B // bm, B, **F32) if two_sided else torch.empty(1, **F32)
  tab = torch.ones(k, B, **F32)
  z = torch.zeros(1, **F32)
  args = (x, y, torch.tensor([SCALE2], **F32), z, torch.zeros(3, device="cuda", dtype=torch.int32),
          tab, tab, z, z, B, B, row_part, col_part, torch.empty_like(row_part),
          torch.empty_like(col_part))
  return do_bench(lambda: _tile_lse_fwd_kernel[(B // bm, col_tiles)](
      *args, D=D, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, NUM_K=D // 64, ROW_THR=False,
      EXCLUDE_SELF=True, TWO_SIDED=two_sided, PRECISION="tf32", K=k, SEGS=segs, HAS_TAB=tables,
      HAS_MASK=False, BOUNDED=False, WANT_MAX=True, num_warps=warps, num_stages=stages),
      warmup=5, rep=40)


def gradient(x, y, k, segs, bm, bn, warps, stages, tables=True, shared=True):
  """One tower's FlashAttention-shaped gradient pass, both softmax roles on (CLIP),
  sharing one exponential per entry (shared=False: one each, the form for blocks whose
  log-normalizers spread over more than 64 log2 units); tables=False: the plain kernel
  with its resident 512-wide row tile."""
  lse = torch.full((k, B), SCALE2 + 16.0, **F32)
  g = torch.full((k, B), 1.0 / B, **F32)
  tab = torch.ones(k, B, **F32)
  z = torch.zeros(1, **F32)
  args = (x, y, torch.tensor([SCALE2, 14.28, 1.0], **F32),
          torch.zeros(2, device="cuda", dtype=torch.int32), lse, g, z, lse, g, z, tab, tab, z, z,
          B, B, B, torch.empty(1, B, D, device="cuda", dtype=torch.bfloat16),
          torch.empty(k, 1, B, **F32))
  return do_bench(lambda: _lse_bwd_kernel[(B // bm, 1, 1)](
      *args, D=D, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=64 if tables else D,
      NUM_D=D // 64 if tables else 1, BLOCK_DO=D, REUSE_Y=not tables, HAS_ROW=True,
      HAS_COL=True, ROW_THR=False, COL_THR=False, EXCLUDE_SELF=True, WANT_CS=True,
      PRECISION="tf32", HAS_MASK=False, K=k, SEGS=segs, HAS_TAB=tables,
      SHARED=shared, num_warps=warps, num_stages=stages), warmup=3, rep=40)


def main():
  x, y = _inputs()
  cases = [
      ("fwd plain (K=1, no tables) 128x128 8 warps", lambda: forward(x, y, 1, 8, 128, 128, 8, 3,
                                                                      tables=False)),
      ("fwd K=1 128x64 8 warps", lambda: forward(x, y, 1, 8, 128, 64, 8, 3)),
      ("fwd K=4 128x64 8 warps", lambda: forward(x, y, 4, SEG4, 128, 64, 8, 3)),
      ("fwd K=4 128x64 8 warps, rows only", lambda: forward(x, y, 4, SEG4, 128, 64, 8, 3,
                                                             two_sided=False)),
      ("fwd K=4 64x64 4 warps (default)", lambda: forward(x, y, 4, SEG4, 64, 64, 4, 3)),
      ("bwd plain resident 64x64 8 warps", lambda: gradient(x, y, 1, 1, 64, 64, 8, 2,
                                                             tables=False)),
      ("bwd plain resident 64x64 8 warps, two exponentials", lambda: gradient(
          x, y, 1, 1, 64, 64, 8, 2, tables=False, shared=False)),
      ("bwd K=1 chunked 32x64 8 warps", lambda: gradient(x, y, 1, 8, 32, 64, 8, 3)),
      ("bwd K=2 (256, 512) 32x64 8 warps", lambda: gradient(x, y, 2, 4 | 8 << 16, 32, 64, 8, 3)),
      ("bwd K=4 32x64 8 warps (default)", lambda: gradient(x, y, 4, SEG4, 32, 64, 8, 3)),
      ("bwd K=4 32x64 8 warps, two exponentials", lambda: gradient(x, y, 4, SEG4, 32, 64, 8, 3,
                                                                   shared=False)),
      ("bwd K=4 64x64 8 warps (spills)", lambda: gradient(x, y, 4, SEG4, 64, 64, 8, 2)),
  ]
  for label, fn in cases:
    try:
      print(f"RESULT {label}: {fn():.2f} ms", flush=True)
    except Exception as e:  # a candidate that does not compile (shared memory) is a result too
      print(f"RESULT {label}: {type(e).__name__}: {str(e)[:160]}", flush=True)


if __name__ == "__main__":
  main()
