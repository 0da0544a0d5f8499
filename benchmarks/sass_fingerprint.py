"""Device-free check that a kernel edit leaves the GPU code alone.

Compiles every kernel over flag and tile variants for sm_90 on this CPU machine and
prints, per variant, a hash of its SASS and a hash of its sorted opcodes (equal
opcodes but different SASS: only register assignment or instruction order changed).
Run it before and after an edit and diff the two outputs.

Pointer arguments are marked divisible by 16, as jax-triton marks them: without that
Triton pipelines no load and the code differs from what the GPU runs.

  python benchmarks/sass_fingerprint.py > before.txt   # edit, rerun, diff

--gluon: the Gluon kernels instead (grad_gluon's gradient over BWD_CASES, the rows'
forward and SPLIT off; stats_gluon's forward), as jax-triton 0.4 compiles them through
``_compat`` (Triton >= 3.9).
"""

from __future__ import annotations

import hashlib
import itertools
import pathlib
import re
import sys

if __package__ in (None, ""):   # run as a file: python benchmarks/sass_fingerprint.py
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from triton.backends.compiler import GPUTarget

from memeff_jax.backends.triton.grad_bwd import _lse_bwd_kernel, _tile_coef_bwd_kernel
from memeff_jax.backends.triton.stats_fwd import _lse_fwd_kernel, _tile_lse_fwd_kernel
# (shared with the smaller-GPU compile test, tests/test_config.py)
from tests.support.compile import compile_kernel, cuobjdump

TARGET = GPUTarget("cuda", 90, 32)


def args(kernel, dt: str) -> list[str]:
  """The runtime argument types of ``kernel`` as the launchers pass them: the towers,
  the gradient and the coefficient slab in the input dtype ``dt``, offsets int32,
  every other array fp32, sizes i32."""
  names = [n for n in kernel.arg_names if not n.isupper()]
  kind = lambda n: (f"*{dt}" if n in ("x_ptr", "y_ptr", "dx_ptr", "c_ptr") else "*i32"
                    if n == "off_ptr" else "*fp32" if n.endswith("_ptr") else "i32")
  return [kind(n) for n in names]


MRL_SEGS = 1 | 2 << 16 | 4 << 32 | 8 << 48   # dims (64, 128, 256, 512) in 64-wide chunks
BWD_FLAGS = ["HAS_ROW", "HAS_COL", "ROW_THR", "COL_THR", "EXCLUDE_SELF", "WANT_CS", "SHARED"]
# The last case also gets HAS_MASK.
BWD_CASES = [(1, 1, 0, 0, 1, 0, 0), (1, 1, 0, 0, 1, 0, 1), (1, 0, 1, 0, 1, 1, 0),
             (0, 1, 0, 1, 1, 0, 0), (1, 1, 1, 1, 1, 1, 1), (1, 1, 1, 1, 1, 1, 0)]


def fingerprint(kernel, arg_types, constexprs, warps, stages) -> str:
  return digests(cuobjdump(compile_kernel(kernel, arg_types, constexprs, warps, stages, TARGET),
                           "-sass"))


def digests(out: str) -> str:
  """Hashes of ``cuobjdump -sass`` output: the code, and its sorted opcodes."""
  lines = [l for l in out.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", l)]
  ops = sorted(re.sub(r"^\s*(@!?U?P\w+\s+)?", "", re.sub(r"/\*[0-9a-f]*\*/", "", l)).split()[0]
               for l in lines)
  digest = lambda text: hashlib.sha1(text.encode()).hexdigest()[:12]
  return f"{digest(chr(10).join(lines))} ops:{digest(' '.join(ops))} n={len(ops)}"


def variants():
  """(label, kernel, argument types, constexprs, warps, stages): the default tiles of
  config.py and both dtypes, over the structural flags."""
  flags = [False, True]
  for dt, d, (bm, bn, w, st) in [("bf16", 128, (128, 64, 8, 3)), ("bf16", 512, (128, 32, 8, 2)),
                                 ("fp32", 512, (32, 32, 8, 2))]:
    for thr, two in itertools.product(flags, flags):
      yield (f"fwd {dt} {d} thr={thr} two={two}", _lse_fwd_kernel, args(_lse_fwd_kernel, dt),
             dict(D=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, NUM_D=1, ROW_THR=thr,
                  EXCLUDE_SELF=True, TWO_SIDED=two, PRECISION="tf32", HAS_MASK=False), w, st)
  yield ("fwd chunked fp32 1152", _lse_fwd_kernel, args(_lse_fwd_kernel, "fp32"),
         dict(D=1152, BLOCK_M=64, BLOCK_N=64, BLOCK_D=64, NUM_D=18, ROW_THR=True,
              EXCLUDE_SELF=True, TWO_SIDED=True, PRECISION="ieee", HAS_MASK=True), 8, 3)
  for dt, d, (bm, bn, bk, w, st) in [("bf16", 512, (128, 128, 64, 8, 3)),
                                     ("fp32", 72, (64, 64, 32, 8, 3))]:
    for thr, excl, two in itertools.product(flags, flags, flags):
      yield (f"tile fwd {dt} {d} thr={thr} excl={excl} two={two}", _tile_lse_fwd_kernel,
             args(_tile_lse_fwd_kernel, dt),
             dict(D=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NUM_K=-(-d // bk), ROW_THR=thr,
                  EXCLUDE_SELF=excl, TWO_SIDED=two, PRECISION="tf32", K=1, SEGS=-(-d // bk),
                  HAS_TAB=False, HAS_MASK=two, BOUNDED=False, WANT_MAX=True, SIGMOID=False),
             w, st)
  # Matryoshka, dims (64, 128, 256, 512): one feature walk, an epilogue per dim.
  for thr, two in itertools.product(flags, flags):
    yield (f"mrl tile fwd bf16 512 thr={thr} two={two}", _tile_lse_fwd_kernel,
           args(_tile_lse_fwd_kernel, "bf16"),
           dict(D=512, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, NUM_K=8, ROW_THR=thr,
                EXCLUDE_SELF=True, TWO_SIDED=two, PRECISION="tf32", K=4, SEGS=MRL_SEGS,
                HAS_TAB=True, HAS_MASK=False, BOUNDED=False, WANT_MAX=True, SIGMOID=False),
           4, 3)
  for dt, d, (bm, bn, w, st), num_d, block_do in [
      ("bf16", 512, (64, 64, 8, 2), 1, 512), ("bf16", 128, (128, 64, 8, 3), 1, 128),
      ("fp32", 1152, (64, 64, 8, 3), 18, 128)]:
    block_d = d if num_d == 1 else 64
    for case in BWD_CASES:
      yield (f"bwd {dt} {d} {case}", _lse_bwd_kernel, args(_lse_bwd_kernel, dt),
             dict(D=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, NUM_D=num_d, BLOCK_DO=block_do,
                  REUSE_Y=num_d == 1 and block_do == block_d, PRECISION="tf32",
                  HAS_MASK=case == BWD_CASES[-1], K=1, SEGS=num_d, HAS_TAB=False,
                  SIGMOID=False, TMA=False, **_bwd_flags(case)), w, st)
  # Matryoshka's FlashAttention-shaped gradient (the bf16 default up to D = 512).
  for case in BWD_CASES:
    yield (f"mrl bwd bf16 512 {case}", _lse_bwd_kernel, args(_lse_bwd_kernel, "bf16"),
           dict(D=512, BLOCK_M=32, BLOCK_N=64, BLOCK_D=64, NUM_D=8, BLOCK_DO=512, REUSE_Y=False,
                PRECISION="tf32", HAS_MASK=case == BWD_CASES[-1], K=4, SEGS=MRL_SEGS,
                HAS_TAB=True, SIGMOID=False, TMA=False,
                **_bwd_flags(case)), 8, 3)
  for dt, d, (bm, bn, bk, w, st) in [("bf16", 1024, (64, 128, 64, 4, 4)),
                                     ("fp32", 72, (64, 64, 32, 8, 3))]:
    for case in BWD_CASES:
      yield (f"tile bwd {dt} {d} {case}", _tile_coef_bwd_kernel,
             args(_tile_coef_bwd_kernel, dt),
             dict(D=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NUM_K=-(-d // bk), PRECISION="tf32",
                  K=1, SEGS=-(-d // bk), HAS_TAB=False, HAS_MASK=case == BWD_CASES[-1],
                  WANT_CS_COL=case == BWD_CASES[-1], SIGMOID=False, FWD=False, EPI_SPLIT=1,
                  **_tile_flags(case)), w, st)
  for case in BWD_CASES:
    yield (f"mrl tile bwd bf16 512 {case}", _tile_coef_bwd_kernel,
           args(_tile_coef_bwd_kernel, "bf16"),
           dict(D=512, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, NUM_K=8, PRECISION="tf32", K=4,
                SEGS=MRL_SEGS, HAS_TAB=True, HAS_MASK=False, WANT_CS_COL=True, SIGMOID=False,
                FWD=False, EPI_SPLIT=1, **_tile_flags(case)),
           8, 3)
  # SigLIP: the tiled forward's and the gradients' sigmoid epilogues, and the fused
  # gradient (FWD) on its shipped tiles (two epilogue chunks) and on 64 x 64 (one).
  for mask in flags:
    yield (f"siglip tile fwd bf16 512 mask={mask}", _tile_lse_fwd_kernel,
           args(_tile_lse_fwd_kernel, "bf16"),
           dict(D=512, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, NUM_K=8, ROW_THR=False,
                EXCLUDE_SELF=False, TWO_SIDED=False, PRECISION="tf32", K=1, SEGS=8,
                HAS_TAB=False, HAS_MASK=mask, BOUNDED=False, WANT_MAX=True, SIGMOID=True), 8, 3)
    yield (f"siglip bwd bf16 512 mask={mask}", _lse_bwd_kernel, args(_lse_bwd_kernel, "bf16"),
           dict(D=512, BLOCK_M=64, BLOCK_N=64, BLOCK_D=512, NUM_D=1, BLOCK_DO=512, REUSE_Y=True,
                PRECISION="tf32", HAS_MASK=mask, K=1, SEGS=1, HAS_TAB=False, SIGMOID=True, TMA=False,
                HAS_ROW=True, HAS_COL=False, ROW_THR=False, COL_THR=False, EXCLUDE_SELF=False,
                WANT_CS=True, SHARED=False), 8, 2)
    for (bm, bn, w, st), split in (((128, 128, 8, 3), 2), ((64, 64, 4, 4), 1)):
      yield (f"siglip fused bf16 512 {bm}x{bn} mask={mask}", _tile_coef_bwd_kernel,
             args(_tile_coef_bwd_kernel, "bf16"),
             dict(D=512, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, NUM_K=8, PRECISION="tf32", K=1,
                  SEGS=8, HAS_TAB=False, HAS_MASK=mask, WANT_CS_COL=False, HAS_ROW=True,
                  HAS_COL=False, ROW_THR=False, COL_THR=False, EXCLUDE_SELF=False,
                  WANT_CS=True, TILE_SHIFT=False, SPAN=64.0, SIGMOID=True, FWD=True,
                  EPI_SPLIT=split), w, st)


def _bwd_flags(case):
  """A BWD_CASES row as the gradient kernels' flags (BWD_FLAGS: bool)."""
  return {k: bool(v) for k, v in zip(BWD_FLAGS, case)}


def _tile_flags(case):
  """The tiled gradient's flags for a BWD_CASES row: its SHARED column picks the
  kernel's own shared exponential (TILE_SHIFT, on the launcher's 64 log2-unit span)."""
  flags = _bwd_flags(case)
  tile_shift = flags.pop("SHARED")
  return dict(flags, TILE_SHIFT=tile_shift, SPAN=64.0)


def gluon_variants():
  """(label, compile report) of the library's Gluon kernels at d = 512, bf16."""
  from benchmarks._gluon import (compile_library_forward,  # pylint: disable=g-import-not-at-top
                                 compile_library_gradient)
  for case in BWD_CASES:
    c = dict(_bwd_flags(case), D=512, HAS_MASK=case == BWD_CASES[-1])
    yield f"gluon bwd {case}", compile_library_gradient("bfloat16", c)
  c = dict(_bwd_flags(BWD_CASES[0]), D=512, HAS_MASK=False)
  yield "gluon bwd split=False", compile_library_gradient("bfloat16", dict(c, SPLIT=False))
  yield ("gluon fwd rows", compile_library_gradient(
      "bfloat16", dict(c, HAS_COL=False, WANT_SUM=True, WANT_MAX=True, SCALED=True)))
  for thr, two in itertools.product((False, True), (False, True)):
    yield f"gluon fwd thr={thr} two={two}", compile_library_forward(
        "bfloat16", dict(D=512, ROW_THR=thr, EXCLUDE_SELF=True, TWO_SIDED=two, HAS_MASK=two,
                         WANT_MAX=True))


def gluon_fingerprint(report: dict) -> str:
  """``report``'s PTX assembled for sm_90a by the wheel's ptxas, then ``digests``."""
  from benchmarks._gluon import assemble  # pylint: disable=g-import-not-at-top
  rc, text, sass = assemble(report["ptx"])
  if rc:
    raise RuntimeError(f"ptxas: {text[-300:]}")
  return digests(sass)


def main():
  if "--gluon" in sys.argv[1:]:
    for label, report in gluon_variants():
      print(label, gluon_fingerprint(report), flush=True)
    return
  for label, *spec in variants():
    print(label, fingerprint(*spec), flush=True)


if __name__ == "__main__":
  main()
