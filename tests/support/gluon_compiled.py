"""Compile the library's Gluon gradient kernel (``grad_gluon``) for sm_90 as jax-triton
launches it through ``_compat`` (no GPU) and print each compile's report
(``benchmarks._gluon.report``: warps, shared memory, wgmma and their full waits,
ptxas's registers and spills) as a JSON list: ``python -m tests.support.gluon_compiled``
with a JSON list of ``[dtype, constexprs]`` on stdin
(test_config.test_gluon_gradient_compiles_for_hopper). Run without TRITON_INTERPRET, so
the kernel is compilable."""

import json
import sys

from benchmarks._gluon import compile_library_gradient, report

if __name__ == "__main__":
  print(json.dumps([report(compile_library_gradient(dtype, constexprs), 4)
                    for dtype, constexprs in json.load(sys.stdin)]))
