"""Compile memeff_jax kernels for a CUDA architecture without a GPU and print each
one's shared memory (bytes) as a JSON list: ``python -m tests.support.compiled_smem CC``
with a JSON list of ``[module, kernel, signature, constexprs, warps, stages]`` on stdin
(test_config.test_fitted_tiles_compile_within_other_gpus). Run without
TRITON_INTERPRET, so the kernels are compilable."""

import importlib
import json
import sys

from triton.backends.compiler import GPUTarget

from tests.support.compile import compile_kernel


def shared_bytes(module, name, sig, constexprs, warps, stages, cc):
  kernel = getattr(importlib.import_module(module), name)
  return compile_kernel(kernel, sig, constexprs, warps, stages,
                        GPUTarget("cuda", cc, 32)).metadata.shared


if __name__ == "__main__":
  cc = int(sys.argv[1])
  print(json.dumps([shared_bytes(*spec, cc) for spec in json.load(sys.stdin)]))
