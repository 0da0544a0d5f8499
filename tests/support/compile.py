"""Compile a Triton kernel for a CUDA architecture without a GPU, as jax-triton would
launch it (the smaller-GPU compile test; benchmarks/sass_fingerprint.py)."""

import inspect
import os
import subprocess
import tempfile

import triton
from triton.compiler import ASTSource

from memeff_jax import _compat

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")


def compile_kernel(kernel, arg_types, constexprs, warps, stages, target):
  """``kernel`` compiled for ``target`` (no GPU needed) as jax-triton launches it:
  every array argument marked 16-byte aligned, so its loads are pipelined; constexprs
  not given take their defaults."""
  names = kernel.arg_names
  constexprs = {p.name: p.default for p in kernel.params
                if p.is_constexpr and p.default is not inspect.Parameter.empty} | constexprs
  runtime = [n for n in names if n not in constexprs]
  sig = dict(zip(runtime, arg_types)) | {k: "constexpr" for k in constexprs}
  attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items()
           if t.startswith("*")}
  src = ASTSource(kernel, sig, attrs=attrs,
                  constexprs={(names.index(k),): v for k, v in constexprs.items()})
  return triton.compile(src, target=target, options=dict(num_warps=warps, num_stages=stages,
                                                          enable_fp_fusion=_compat.FP_FUSION))


def cuobjdump(compiled, flag: str) -> str:
  """``cuobjdump flag`` (``-sass``, ``-res-usage``) of a compiled kernel's cubin."""
  with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
    f.write(compiled.asm["cubin"])
    f.flush()
    return subprocess.run([CUOBJDUMP, flag, f.name], capture_output=True, text=True).stdout
