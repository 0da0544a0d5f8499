"""What the Gluon probes (bench_gluon_fwd.py, bench_gluon_grad.py) share: compiling a Triton
or Gluon kernel for sm_90 as jax-triton would (no GPU), jax-triton 0.4.1's Gluon compile
rerouted, the compile report, and each variant's run on the GPU under a watchdog.

jax-triton 0.4.1 compiles a Gluon module with Triton's make_ttir + make_ttgir passes,
which rewrite the hand-written kernel (compiled here: a ``wgmma.wait_group 0`` after
every wgmma, so no wgmma stays in flight, and extra layout conversions);
``memeff_jax._compat`` routes Gluon modules through ``gluon_to_ttgir`` as
``triton.compile`` does (the library's Gluon kernel needs it too).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

import triton
from triton.experimental.gluon import language as gl

from memeff_jax import _compat

# Triton >= 3.8's PTX wants its newer ptxas (the wheel's ptxas-blackwell; Hopper too)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
PTXAS = os.environ.get("TRITON_PTXAS_BLACKWELL_PATH") or next(
    (p for p in (os.path.join(_BIN, "ptxas-blackwell"), os.path.join(_BIN, "ptxas"))
     if os.path.exists(p)), "ptxas")


def is_gluon(kernel) -> bool:
  """Whether ``kernel`` is a Gluon kernel (its launch takes Gluon's host descriptors)."""
  return getattr(kernel, "is_gluon", lambda: False)()


def layout(block):
  """The NVMMA shared layout of a bf16 ``block`` (what Gluon's host descriptors carry)."""
  return gl.NVMMASharedLayout.get_default_for(list(block), gl.bfloat16)


def compile_sm90(kernel, sig: dict, ptrs, consts: dict, warps: int, stages: int,
                 ctas: int = 1) -> dict:
  """``kernel`` compiled for sm_90 as jax-triton (through ``_compat``) would:
  ``sig`` the runtime arguments' types by name (the rest are ``consts``), the arrays and
  descriptors named in ``ptrs`` 16-byte aligned, a constexpr not in ``consts`` its declared
  default (as jax-triton 0.4 fills it); ``ctas`` programs a cluster."""
  from triton._C import libtriton  # pylint: disable=g-import-not-at-top
  from triton.backends.compiler import GPUTarget  # pylint: disable=g-import-not-at-top
  from triton.compiler import ASTSource  # pylint: disable=g-import-not-at-top
  from triton.experimental.gluon import _runtime  # pylint: disable=g-import-not-at-top
  names = kernel.arg_names
  consts = {**{p.name: getattr(p.default, "value", p.default) for p in kernel.params
               if p.is_constexpr and p.has_default}, **consts}
  sig = {n: sig.get(n, "constexpr") for n in names}
  attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ptrs}
  target = GPUTarget("cuda", 90, 32)
  backend = triton.compiler.make_backend(target)
  options = backend.parse_options(dict(num_warps=warps, num_stages=stages, num_ctas=ctas,
                                       enable_fp_fusion=_compat.FP_FUSION))
  context = libtriton.ir.context()
  libtriton.ir.load_dialects(context)
  backend.load_dialects(context)
  cls = _runtime.GluonASTSource if is_gluon(kernel) else ASTSource
  module = cls(kernel, sig, consts, attrs).make_ir(
      target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
      context)
  return _compat.gluon_ptx(module, backend, options, target.arch)


def compile_library_gradient(dtype: str, constexprs: dict) -> dict:
  """The library's Gluon gradient kernel (``grad_gluon._lse_bwd_gluon_kernel``) compiled
  by ``compile_sm90`` for ``dtype`` ("bfloat16" / "float16") inputs, its descriptors
  carrying Gluon's NVMMA layout (``_compat.Tiles(gluon=True)``); dx in float16 where
  SCALED (the forward's rows)."""
  from memeff_jax.backends.triton import grad_gluon as g  # pylint: disable=g-import-not-at-top
  return _compile_library(g._lse_bwd_gluon_kernel, (g.BLOCK_M, g.BLOCK_N, g.BLOCK_K), dtype,
                          constexprs, ("lse_r_ptr", "g_r_ptr", "thr_r_ptr", "lse_c_ptr",
                                       "g_c_ptr", "thr_c_ptr", "cs_ptr", "sum_ptr", "max_ptr",
                                       "big_ptr"),
                          dict(dx_ptr="float16" if constexprs.get("SCALED") else dtype))


def library_gradient_outputs(n: int, d: int, dtype) -> list:
  """The library's Gluon gradient kernel's outputs for one split, none of WANT_SUM /
  WANT_MAX / SCALED: dx [1, n, d], the groups' c s sums [2, 1, n], and the 1-element
  stand-ins for sum_ptr, max_ptr and big_ptr (jax-triton wants one per output pointer)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  one = jax.ShapeDtypeStruct((1,), jnp.float32)
  return [jax.ShapeDtypeStruct((1, n, d), dtype), jax.ShapeDtypeStruct((2, 1, n), jnp.float32),
          one, one, one]


def compile_library_forward(dtype: str, constexprs: dict) -> dict:
  """The library's Gluon forward kernel (``stats_gluon._lse_fwd_gluon_kernel``), as
  ``compile_library_gradient``."""
  from memeff_jax.backends.triton import stats_gluon as g  # pylint: disable=g-import-not-at-top
  return _compile_library(g._lse_fwd_gluon_kernel, (g.BLOCK_M, g.BLOCK_N, g.BLOCK_K), dtype,
                          constexprs, ("thr_ptr", "row_part_ptr", "col_part_ptr", "row_max_ptr",
                                       "col_max_ptr"), {})


def _compile_library(kernel, blocks, dtype: str, constexprs: dict, fp32_ptrs, typed: dict):
  """A library Gluon kernel taking (x_desc, y_desc) in [BLOCK_M | BLOCK_N, BLOCK_K] blocks,
  off_ptr, n, m, cols_per_split, fp32 ``scal_ptr``, ``xb_ptr``, ``yb_ptr`` and
  ``fp32_ptrs``, and ``typed`` pointers of the input dtype, compiled by ``compile_sm90``."""
  short = {"bfloat16": "bf16", "float16": "fp16"}
  block_m, block_n, k = blocks

  def desc(rows):
    layout = gl.NVMMASharedLayout.get_default_for([rows, k], getattr(gl, dtype))
    return f"tensordesc<{short[dtype]}[{rows},{k}],{layout!r}>"

  sig = dict(x_desc=desc(block_m), y_desc=desc(block_n), off_ptr="*i32", n="i32", m="i32",
             cols_per_split="i32",
             **{p: "*fp32" for p in ("scal_ptr", "xb_ptr", "yb_ptr", *fp32_ptrs)},
             **{p: f"*{short[t]}" for p, t in typed.items()})
  ptrs = [name for name, t in sig.items() if t.startswith(("*", "tensordesc"))]
  return compile_sm90(kernel, sig, ptrs, constexprs, 4, 1)


def assemble(ptx: str):
  """``ptx`` through ``ptxas -v -arch=sm_90a``: its return code and report, and the cubin's
  ``cuobjdump -sass`` ("" where ptxas failed)."""
  with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "k.ptx")
    with open(src, "w") as f:
      f.write(ptx)
    out = subprocess.run([PTXAS, "-v", "-arch=sm_90a", src, "-o", os.path.join(tmp, "k.cubin")],
                         capture_output=True, text=True)
    sass = "" if out.returncode else subprocess.run(
        [os.path.join(_BIN, "cuobjdump"), "-sass", os.path.join(tmp, "k.cubin")],
        capture_output=True, text=True).stdout
  return out.returncode, out.stdout + out.stderr, sass


def ptxas(ptx: str) -> dict:
  """Registers, spill stores / loads and warnings of ``ptx`` by ``ptxas -v -arch=sm_90a``
  (a serialized wgmma chain is a warning), and ``tile_loops``."""
  rc, text, sass = assemble(ptx)
  regs = re.search(r"Used (\d+) registers", text)
  spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
  return dict(registers=int(regs.group(1)) if regs else None,
              spill_stores=int(spill.group(1)) if spill else None,
              spill_loads=int(spill.group(2)) if spill else None,
              ptxas_rc=rc, ptxas_err="" if rc == 0 else text[-300:],
              ptxas_warnings=[" ".join(l.split())[:200] for l in text.splitlines()
                              if "warning" in l.lower()],
              tile_loops=tile_loops(sass))


def tile_loops(sass: str) -> list:
  """Each consumer's column-tile loop in ``sass``: [instructions, MUFU, HGMMA] of the
  spans from a backward branch's target to the branch that hold both an exponential and
  a wgmma, shortest first, dropping any that overlaps one kept (one a consumer partition:
  the static count of one iteration; the mbarrier waits' retry blocks, placed out of
  line, not included)."""
  at, ops = [], []
  for line in sass.splitlines():
    m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m:
      at.append(int(m.group(1), 16))
      ops.append(m.group(2))
  index = {a: i for i, a in enumerate(at)}
  spans = []
  for i, op in enumerate(ops):
    target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", op)
    start = index.get(int(target.group(1), 16), i) if target else i
    if start < i:   # a backward branch
      body = ops[start:i + 1]
      mufu, mma = sum("MUFU" in o for o in body), sum("HGMMA" in o for o in body)
      if mufu and mma:
        spans.append((start, i, [len(body), mufu, mma]))
  kept = []   # shortest first; a span overlapping a kept one is a branch back into it
  for a, b, c in sorted(spans, key=lambda s: s[1] - s[0]):
    if all(b < a2 or b2 < a for a2, b2, _ in kept):
      kept.append((a, b, c))
  return [c for _, _, c in sorted(kept)]


def report(compiled: dict, warps: int) -> dict:
  """What a compile gives: the warps asked, in the metadata and in the PTX's
  ``.reqntid`` (what ``_compat`` launches), registers (``.maxnreg``, ``setmaxnreg``, ptxas),
  shared memory, whether it is partitioned, wgmma and their full waits, TMA loads."""
  ptx, md = compiled["ptx"], compiled["md"]
  reqntid = re.search(r"^\s*\.reqntid\s+(\d+)", ptx, re.MULTILINE)
  maxnreg = re.search(r"^\s*\.maxnreg\s+(\d+)", ptx, re.MULTILINE)
  return dict(
      asked_warps=warps, metadata_warps=md["num_warps"],
      reqntid_warps=int(reqntid.group(1)) // 32 if reqntid else None,
      maxnreg=int(maxnreg.group(1)) if maxnreg else None,
      shared_kib=round(md["shared"] / 1024, 1), global_scratch=md.get("global_scratch_size"),
      partitioned="ttg.warp_specialize" in compiled["ttgir"],
      setmaxnreg=re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx),
      wgmma=ptx.count("wgmma.mma_async"),
      wait_group0=len(re.findall(r"wgmma\.wait_group\.sync\.aligned 0;", ptx)),
      tma_loads=ptx.count("cp.async.bulk.tensor"), **ptxas(ptx))


def compile_rows(a, variants: dict, build) -> None:
  """``--compile-only``: for every variant of ``variants`` (name -> tuple whose last item
  says whether it runs at D) and D of ``a.dims``, ``build(variant, d)`` -> (compiled,
  warps, extra row fields), printed as a COMPILE line."""
  print(f"triton {triton.__version__}, sm_90 (ptxas -arch=sm_90a)", flush=True)
  for d in map(int, a.dims.split(",")):
    for variant in a.variants.split(","):
      if not variants[variant][-1](d):
        continue
      row = dict(variant=variant, dim=d)
      try:
        compiled, warps, extra = build(variant, d)
        row.update(extra, **report(compiled, warps))
      except Exception as e:   # pylint: disable=broad-except
        row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
      print("COMPILE " + json.dumps(row), flush=True)


def compiled_via() -> str:
  """How jax-triton compiles the Gluon kernels here, for the notes: ``_compat`` routes
  Gluon modules through ``gluon_to_ttgir`` where jax-triton has the hook."""
  try:
    from jax_triton import triton_lib  # pylint: disable=g-import-not-at-top
  except ImportError as e:   # jax-triton missing: every variant reports it
    print(f"jax-triton: {e}", file=sys.stderr)
    return "no jax-triton"
  if hasattr(triton_lib, "compile_ttir_inplace"):
    return "gluon_to_ttgir"
  return "jax-triton's make_ttir + make_ttgir"


def guarded(row: dict, timeout: float, body) -> None:
  """``body(row)`` (fills the row: check, then timing), then the row as a RESULT line; an
  exception goes to the row's note. A variant still running after ``timeout`` seconds
  (e.g. an mbarrier that never completes) is reported and ends the process (code 124),
  so the riskier variants come last."""
  def hung():
    row["note"] += f"; no result after {timeout} s: stopped the run"
    print("RESULT " + json.dumps(row), flush=True)
    os._exit(124)   # pylint: disable=protected-access

  watchdog = threading.Timer(timeout, hung)
  watchdog.daemon = True
  watchdog.start()
  try:
    body(row)
  except Exception as e:   # pylint: disable=broad-except
    row["note"] += (("; " if row["note"] else "") + f"{type(e).__name__}: "
                    f"{' '.join(str(e).split())[:300]}")
  watchdog.cancel()
  print("RESULT " + json.dumps(row), flush=True)


def main(variants: dict, run, compile_only, reps: int) -> None:
  """The probes' command line: ``run(a)`` on the GPU, ``compile_only(a)`` without one."""
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=65536)
  p.add_argument("--dims", default="128,512")
  p.add_argument("--reps", type=int, default=reps)
  p.add_argument("--variants", default=",".join(variants))
  p.add_argument("--variant-timeout", type=float, default=45.0,
                 help="seconds a variant (compile, check, timing) may take before the run stops")
  p.add_argument("--compile-only", action="store_true",
                 help="compile every variant for sm_90 here (no GPU, no jax launch)")
  a = p.parse_args()
  (compile_only if a.compile_only else run)(a)
