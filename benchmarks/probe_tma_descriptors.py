"""Whether host-side TMA descriptors (``jax_triton.TensorDescriptor``, jax-triton >= 0.4)
launch under ``jax.jit`` with XLA's command buffers on, and follow new buffers: a
GEMM tile kernel reading both operands through descriptors, called twice in one jitted
function, against XLA's dot (GPU only; NOTES.md 2026-12-03: device-side descriptors,
``tl.make_tensor_descriptor``, fail there, so the gradient's TMA loads are host-side).

  python benchmarks/probe_tma_descriptors.py
"""

import jax
import jax.numpy as jnp
import jax_triton as jt
import triton
import triton.language as tl


@triton.jit
def _gemm(x_desc, y_desc, o_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          K: tl.constexpr):
  i, j = tl.program_id(0), tl.program_id(1)
  acc = tl.zeros([BM, BN], tl.float32)
  for c in range(0, K, BK):
    acc = tl.dot(x_desc.load([i * BM, c]), tl.trans(y_desc.load([j * BN, c])), acc)
  n = tl.num_programs(1) * BN
  r, q = i * BM + tl.arange(0, BM), j * BN + tl.arange(0, BN)
  tl.store(o_ptr + r[:, None] * n + q[None, :], acc)


def gemm(x, y):
  """x @ y.T (fp32) through descriptors of 128 x 64 blocks."""
  desc = lambda a: jt.TensorDescriptor.from_array(a, (128, 64))
  return jt.triton_call(desc(x), desc(y), kernel=_gemm,
                        out_type=jax.ShapeDtypeStruct((x.shape[0], y.shape[0]), jnp.float32),
                        grid=(x.shape[0] // 128, y.shape[0] // 128), num_warps=4, num_stages=3,
                        BM=128, BN=128, BK=64, K=x.shape[1])


def main():
  x, y = (jax.random.normal(k, (4096, 512), jnp.bfloat16)
          for k in jax.random.split(jax.random.key(0), 2))
  step = jax.jit(lambda x, y: jnp.sum(gemm(x, y) * 2.0) + jnp.sum(gemm(y, x)))
  for a in (x, x + 1):   # new buffers: the descriptors must follow the addresses
    got = float(step(a, y))
    want = float(jnp.sum(jnp.dot(a, y.T, preferred_element_type=jnp.float32)) * 3.0)
    print(f"under jit: {got:.6g}, XLA's dot: {want:.6g}, relative {abs(got - want) / abs(want):.2e}")


if __name__ == "__main__":
  main()
