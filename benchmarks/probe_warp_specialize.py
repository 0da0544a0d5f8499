"""Device-free probe: what ``tl.range(..., warp_specialize=True)`` does on sm_90 with
the installed Triton.

Compiles small GEMM-tile kernels with a sigmoid epilogue (the shape of SigLIP's
coefficient tiles, 128 x 128, D = 512, 64-feature chunks) for sm_90 on this machine,
with and without warp specialization on the feature loop or on a persistent tile loop,
their tiles loaded through pointers or through ``tl.make_tensor_descriptor`` (TMA), and
prints per variant whether the compile partitioned the warps (a ``ttg.warp_specialize``
op), the warp count the compiled metadata reports (the count a launch must use), shared
memory and registers a thread. NOTES.md 2026-12-03 has the result for Triton 3.9.

  python benchmarks/probe_warp_specialize.py
"""

from __future__ import annotations

import os
import pathlib
import sys

if __package__ in (None, ""):   # run as a file: python benchmarks/probe_warp_specialize.py
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from tests.support.compile import compile_kernel, cuobjdump


@triton.jit
def _epilogue(acc, c_ptr, sp_ptr, tm, tn, n, m, BM: tl.constexpr, BN: tl.constexpr):
  e = tl.exp(-tl.abs(acc))
  r = 1.0 / (1.0 + e)
  sig = tl.where(acc >= 0, r, e * r)
  rows = tm * BM + tl.arange(0, BM)
  tl.store(c_ptr + rows.to(tl.int64)[:, None] * m + (tn * BN + tl.arange(0, BN))[None, :],
           sig.to(c_ptr.dtype.element_ty))
  tl.store(sp_ptr + tn * n + rows, tl.sum(e, 1))


@triton.jit
def _tile(x_ptr, y_ptr, c_ptr, sp_ptr, n, m, D: tl.constexpr, BM: tl.constexpr,
          BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr, TMA: tl.constexpr):
  """One tile a program; WS on the feature loop."""
  tm, tn = tl.program_id(0), tl.program_id(1)
  acc = tl.zeros([BM, BN], dtype=tl.float32)
  if TMA:
    xd = tl.make_tensor_descriptor(x_ptr, shape=[n, D], strides=[D, 1], block_shape=[BM, BK])
    yd = tl.make_tensor_descriptor(y_ptr, shape=[m, D], strides=[D, 1], block_shape=[BN, BK])
    for k in tl.range(0, D, BK, warp_specialize=WS):
      acc = tl.dot(xd.load([tm * BM, k]), tl.trans(yd.load([tn * BN, k])), acc)
  else:
    for k in tl.range(0, D, BK, warp_specialize=WS):
      a = tl.load(x_ptr + (tm * BM + tl.arange(0, BM))[:, None] * D + k +
                  tl.arange(0, BK)[None, :])
      b = tl.load(y_ptr + (tn * BN + tl.arange(0, BN))[:, None] * D + k +
                  tl.arange(0, BK)[None, :])
      acc = tl.dot(a, tl.trans(b), acc)
  _epilogue(acc, c_ptr, sp_ptr, tm, tn, n, m, BM, BN)


@triton.jit
def _persistent(x_ptr, y_ptr, c_ptr, sp_ptr, n, m, D: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr, TMA: tl.constexpr):
  """132 programs walking the tiles; WS on the tile loop (an epilogue that could overlap
  the next tile's GEMM)."""
  xd = tl.make_tensor_descriptor(x_ptr, shape=[n, D], strides=[D, 1], block_shape=[BM, BK])
  yd = tl.make_tensor_descriptor(y_ptr, shape=[m, D], strides=[D, 1], block_shape=[BN, BK])
  tiles_m = n // BM
  for t in tl.range(tl.program_id(0), tiles_m * (m // BN), 132, flatten=True,
                    warp_specialize=WS):
    tm, tn = t % tiles_m, t // tiles_m
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, D, BK):
      acc = tl.dot(xd.load([tm * BM, k]), tl.trans(yd.load([tn * BN, k])), acc)
    _epilogue(acc, c_ptr, sp_ptr, tm, tn, n, m, BM, BN)


def _quiet(fn):
  """fn(), with the compiler's own stderr (a failed pass's reproducer) discarded."""
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(os.devnull, "w") as null:
      os.dup2(null.fileno(), 2)
      return fn()
  finally:
    os.dup2(saved, 2)
    os.close(saved)


def _registers(kernel) -> str:
  out = cuobjdump(kernel, "-res-usage")
  return next((l.split()[0].split(":")[1] for l in out.splitlines() if "REG:" in l), "?")


def main():
  print(f"triton {triton.__version__}, sm_90, 128 x 128 tiles, D = 512, 64-feature chunks")
  print("kernel       loads    warps  WS     partitioned  metadata warps  smem KiB  registers")
  args = ["*bf16", "*bf16", "*bf16", "*fp32", "i32", "i32"]
  for kernel, name in ((_tile, "tile"), (_persistent, "persistent")):
    for tma in ((False, True) if kernel is _tile else (True,)):
      for warps in (4, 8):
        for ws in (False, True):
          label = f"{name:<12} {'TMA' if tma else 'pointers':<8} {warps:<6} {str(ws):<6}"
          try:
            k = _quiet(lambda: compile_kernel(
                kernel, args, dict(D=512, BM=128, BN=128, BK=64, WS=ws, TMA=tma), warps, 3,
                GPUTarget("cuda", 90, 64)))
          except Exception as e:   # pylint: disable=broad-except
            print(f"{label} compile failed: {type(e).__name__}: {str(e).splitlines()[0][:60]}")
            continue
          split = "ttg.warp_specialize" in k.asm["ttgir"]
          print(f"{label} {str(split):<12} {k.metadata.num_warps:<15} "
                f"{k.metadata.shared / 1024:<9.0f} {_registers(k)}")


if __name__ == "__main__":
  main()
