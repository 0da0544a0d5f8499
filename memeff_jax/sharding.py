"""``sharded``: a per-shard loss over global arrays, for callers that hold those.

Inside ``jax.shard_map`` the losses take ``axis_name=`` and run the ring (``ring.py``);
``sharded`` is the dozen lines that put a loss there: split the batch over one or
more mesh axes, replicate scalars, run ``jax.shard_map``, hand back a replicated loss
and per-row statistics as global arrays.
"""

from __future__ import annotations

import inspect
import math
from typing import Callable, Hashable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P


def sharded(loss_fn: Callable, mesh: jax.sharding.Mesh,
            axis_name: Hashable | tuple[Hashable, ...]) -> Callable:
  """Run ``loss_fn`` over global arrays split along ``axis_name`` of ``mesh``.

  Returns ``f(*arrays, **kwargs)``: every array argument with a leading batch axis
  (positional, or a keyword such as a per-row ``tau_plus``; jax or numpy) is split
  along it into contiguous shards, 0-d arrays (a learnable temperature) are
  replicated, other keywords are passed through as static values, and
  ``loss_fn(..., axis_name=axis_name)`` runs once per device under ``jax.shard_map``.
  The loss comes back replicated; per-row statistics come back as global arrays.
  Differentiate ``f`` directly: its gradients are those of the global loss. ``f``
  works eagerly and under ``jax.jit`` (it jits itself), on meshes from
  ``jax.make_mesh`` (Explicit or Auto axes) or ``Mesh(...)``, with global arrays
  sharded any way or not at all. (Eager ``jax.grad`` over Explicit axes needs
  ``jax.set_mesh(mesh)``, as it does for any JAX code.)

  Args:
    loss_fn: a loss taking ``axis_name=`` (every loss here, or a function around one).
    mesh: the device mesh.
    axis_name: the mesh axis the batch is split over, or a tuple of them (FSDP-style
      ``("data", "fsdp")``: the batch is split over all of them, major to minor, and
      ``loss_fn`` gets the tuple).

  Raises:
    ValueError: an axis the mesh does not have, or a global batch that does not split
      into equal shards; the loss's own errors name the global shapes.
  """
  axes = _mesh_axes(mesh, axis_name)
  size = math.prod(mesh.shape[a] for a in axes)
  batch = P(axes[0] if len(axes) == 1 else axes)
  explicit = any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))

  def run(args, arrays, static: _Static):
    kw = dict(static.items)
    whole = lambda a, k: loss_fn(*a, **k, **kw, axis_name=None)
    # The global batch on one device: the loss's own errors name the shapes the caller
    # passed, and comparing with one shard's outputs tells which outputs are per-row.
    abstract = lambda v: jax.ShapeDtypeStruct(np.shape(v), jnp.result_type(v))
    out_global = jax.eval_shape(whole, *jax.tree.map(abstract, (args, arrays)))
    for name, v in _named(loss_fn, args, arrays):
      if np.ndim(v) > 0 and np.shape(v)[0] % size:
        raise ValueError(f"{name} with shape {np.shape(v)} does not split into {size} equal "
                         f"shards along mesh axis {axis_name!r} (batch % devices != 0)")
    local = lambda v: jax.ShapeDtypeStruct(
        (np.shape(v)[0] // size,) + np.shape(v)[1:] if np.ndim(v) else (),
        jnp.result_type(v))
    out_local = jax.eval_shape(whole, *jax.tree.map(local, (args, arrays)))
    out_specs = jax.tree.map(lambda g, l: _out_spec(g.shape, l.shape, batch), out_global,
                             out_local)
    in_specs = jax.tree.map(lambda v: batch if np.ndim(v) else P(), (args, arrays))
    if explicit:   # Explicit axes: shard_map wants its inputs typed with in_specs
      args, arrays = jax.tree.map(
          lambda v, s: jax.sharding.reshard(v, NamedSharding(mesh, s)), (args, arrays),
          in_specs)
    per_shard = lambda a, k: loss_fn(*a, **k, **kw, axis_name=axis_name)
    # check_vma=True: JAX tracks which values vary over the axes, which is what makes
    # a replicated loss differentiate to the global loss's local gradient (and lets the
    # losses reject replicated inputs).
    return jax.shard_map(per_shard, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=True)(args, arrays)

  # jit: custom_vjp(symbolic_zeros) under an eager shard_map is not implemented in JAX,
  # and one compile serves every later call with the same static keywords.
  jitted = jax.jit(run, static_argnums=2)

  def f(*args, **kwargs):
    arrays = {k: v for k, v in kwargs.items() if _is_array(v)}
    static = _Static(tuple(sorted(((k, v) for k, v in kwargs.items() if k not in arrays),
                                  key=lambda kv: kv[0])))
    return jitted(args, arrays, static)

  return f


def _mesh_axes(mesh, axis_name) -> tuple:
  names = tuple(mesh.axis_names)
  axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
  unknown = [a for a in axes if a not in names]
  if not axes or unknown:
    raise ValueError(f"axis_name={axis_name!r}: the mesh has axes {names} (shape "
                     f"{dict(mesh.shape)}); pass one of them or a tuple of them")
  if len(set(axes)) != len(axes):
    raise ValueError(f"axis_name={axis_name!r} names a mesh axis twice")
  return axes


def _is_array(v) -> bool:
  """Arrays are split or replicated; numpy scalars stay static, like Python numbers."""
  return isinstance(v, (jax.Array, np.ndarray))


def _named(loss_fn, args, arrays):
  """(argument name, value) of every array the caller passed, names from the
  signature where it has them."""
  try:
    params = [p.name for p in inspect.signature(loss_fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  except (TypeError, ValueError):
    params = []
  named = [(params[i] if i < len(params) else f"positional argument {i}", a)
           for i, a in enumerate(args)]
  named += list(arrays.items())
  return [(name, leaf) for name, v in named for leaf in jax.tree.leaves(v)]


def _out_spec(global_shape, local_shape, batch: P) -> P:
  """The output's batch axis is the one a shard shrinks (none: replicated)."""
  split = [i for i, (g, l) in enumerate(zip(global_shape, local_shape)) if g != l]
  if not split:
    return P()
  return P(*([None] * split[0]), *batch)


class _Static:
  """The keywords that are not arrays, as one static jit argument. Unhashable values
  (a list) compare by identity: such a call recompiles, but still runs."""

  def __init__(self, items):
    self.items = items
    try:
      self._hash = hash(items)
    except TypeError:
      self._hash = None

  def __hash__(self):
    return id(self) if self._hash is None else self._hash

  def __eq__(self, other):
    if self._hash is None or not isinstance(other, _Static) or other._hash is None:
      return self is other
    return self.items == other.items
