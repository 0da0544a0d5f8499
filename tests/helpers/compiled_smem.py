"""Compile memeff_jax kernels for a CUDA architecture without a GPU and print each
one's shared memory (bytes) as a JSON list: ``python -m tests.helpers.compiled_smem CC``
with a JSON list of ``[module, kernel, signature, constexprs, warps, stages]`` on stdin
(test_config.test_fitted_tiles_compile_within_smaller_gpus). Run without
TRITON_INTERPRET, so the kernels are compilable."""

import importlib
import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def shared_bytes(module, name, sig, constexprs, warps, stages, cc):
  kernel = getattr(importlib.import_module(module), name)
  names = kernel.arg_names
  runtime = [a for a in names if a not in constexprs]
  signature = dict(zip(runtime, sig)) | {k: "constexpr" for k in constexprs}
  # jax-triton marks every array argument 16-byte aligned (so loads are pipelined).
  attrs = {(names.index(a),): [["tt.divisibility", 16]] for a, t in signature.items()
           if t.startswith("*")}
  src = ASTSource(kernel, signature, attrs=attrs,
                  constexprs={(names.index(k),): v for k, v in constexprs.items()})
  compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                            options=dict(num_warps=warps, num_stages=stages))
  return compiled.metadata.shared


if __name__ == "__main__":
  cc = int(sys.argv[1])
  print(json.dumps([shared_bytes(*spec, cc) for spec in json.load(sys.stdin)]))
