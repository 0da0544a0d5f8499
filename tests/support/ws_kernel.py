"""A warp-specialized GEMM tile: out = x y^T, its feature loop under Triton's
``tl.range(..., warp_specialize=True)`` on device-side tensor descriptors. Compiled for
sm_90 with the 4 warps asked, Triton >= 3.9 splits it into a TMA producer and two
consumer warp groups: 12 warps, which the launch must use (``_compat.compiled_warps``).

``python -m tests.support.ws_kernel`` compiles it for sm_90 without a GPU, with and
without WS, and prints [[metadata warps, compiled_warps(PTX, 4)], ...] as JSON
(test_backends.test_compiled_warps_read_the_ptx; run without TRITON_INTERPRET)."""

import json

import triton
import triton.language as tl

WARPS = 4
TILE = dict(BM=128, BN=128, BK=64)


@triton.jit
def ws_matmul(x_ptr, y_ptr, n, m, out_ptr, D: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr):
  pid_m, pid_n = tl.program_id(0), tl.program_id(1)
  xd = tl.make_tensor_descriptor(x_ptr, shape=[n, D], strides=[D, 1], block_shape=[BM, BK])
  yd = tl.make_tensor_descriptor(y_ptr, shape=[m, D], strides=[D, 1], block_shape=[BN, BK])
  acc = tl.zeros([BM, BN], dtype=tl.float32)
  for k in tl.range(0, D, BK, warp_specialize=WS):
    acc = tl.dot(xd.load([pid_m * BM, k]), tl.trans(yd.load([pid_n * BN, k])), acc)
  rows = pid_m * BM + tl.arange(0, BM)
  cols = pid_n * BN + tl.arange(0, BN)
  tl.store(out_ptr + rows.to(tl.int64)[:, None] * m + cols[None, :], acc,
           mask=(rows < n)[:, None] & (cols < m)[None, :])


if __name__ == "__main__":
  from triton.backends.compiler import GPUTarget  # pylint: disable=g-import-not-at-top

  from memeff_jax._compat import compiled_warps  # pylint: disable=g-import-not-at-top
  from tests.support.compile import compile_kernel  # pylint: disable=g-import-not-at-top
  found = []
  for ws in (True, False):
    k = compile_kernel(ws_matmul, ["*bf16", "*bf16", "i32", "i32", "*fp32"],
                       dict(D=256, WS=ws, **TILE), WARPS, 3, GPUTarget("cuda", 90, 32))
    found.append([k.metadata.num_warps, compiled_warps(k.asm["ptx"], WARPS)])
  print(json.dumps(found))
