"""One process of the two-process jax.distributed test (tests/test_ring.py).

Usage: python distributed_worker.py PORT PROCESS_ID BACKEND
Each process owns 2 CPU devices; the mesh spans all 4. It prints one JSON line
with the global loss and the max gradient error against the single-device loss.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ.setdefault("TRITON_INTERPRET", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
import memeff_jax as mj  # noqa: E402


def main():
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  port, pid, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                             process_id=pid, initialization_timeout=120)
  assert jax.device_count() == 4 and jax.local_device_count() == 2
  mesh = Mesh(np.array(jax.devices()), ("batch",))
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal((16, 12), np.float32), rng.standard_normal((16, 12), np.float32)
  tau = rng.uniform(0, 0.3, 16).astype(np.float32)
  sharding = NamedSharding(mesh, P("batch"))
  glob = lambda a: jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])
  kw = dict(label_smoothing=0.1, lse_square_scale=1e-2, backend=backend)
  loss_fn = mj.sharded(lambda a, b, t, axis_name: mj.clip_loss(a, b, tau_plus=t,
                                                               axis_name=axis_name, **kw),
                       mesh, "batch")
  step = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))
  val, (gx, gy) = step(glob(x), glob(y), glob(tau))
  # Single-device reference on this process (the same math on the whole batch).
  with jax.default_device(jax.local_devices()[0]):
    rval, (rx, ry) = jax.value_and_grad(
        lambda a, b: mj.clip_loss(a, b, tau_plus=jnp.asarray(tau), **kw), argnums=(0, 1))(
            jnp.asarray(x), jnp.asarray(y))
  local = lambda g: np.concatenate([np.asarray(s.data) for s in sorted(
      g.addressable_shards, key=lambda s: s.index[0].start)])
  rows = np.concatenate([np.arange(16)[s.index[0]] for s in sorted(
      gx.addressable_shards, key=lambda s: s.index[0].start)])
  err = max(float(np.max(np.abs(local(gx) - np.asarray(rx)[rows]))),
            float(np.max(np.abs(local(gy) - np.asarray(ry)[rows]))))
  print(json.dumps(dict(pid=pid, loss=float(np.asarray(val.addressable_shards[0].data)),
                        ref=float(rval), grad_err=err)), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
