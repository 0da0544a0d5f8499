"""Compile the library's Gluon kernels (``grad_gluon``'s gradient, ``stats_gluon``'s
forward) for sm_90 as jax-triton launches them through ``_compat`` (no GPU) and print each
compile's report (``benchmarks._gluon.report``: warps, shared memory, wgmma and their
full waits, ptxas's registers and spills) as a JSON list: ``python -m
tests.support.gluon_compiled`` with a JSON list of ``[kernel, dtype, constexprs]`` on stdin,
kernel "gradient" or "forward" (test_config.test_gluon_kernels_compile_for_hopper). Run
without TRITON_INTERPRET, so the kernels are compilable."""

import json
import sys

from benchmarks._gluon import compile_library_forward, compile_library_gradient, report

if __name__ == "__main__":
  build = {"gradient": compile_library_gradient, "forward": compile_library_forward}
  print(json.dumps([report(build[kernel](dtype, constexprs), 4)
                    for kernel, dtype, constexprs in json.load(sys.stdin)]))
