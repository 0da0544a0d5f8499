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
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P


def sharded(loss_fn: Callable, mesh: jax.sharding.Mesh,
            axis_name: Hashable | tuple[Hashable, ...]) -> Callable:
  """Run ``loss_fn`` over global arrays split along ``axis_name`` of ``mesh``.

  Returns ``f(*arrays, **kwargs)``: every array argument with a leading batch axis
  (positional, or a keyword such as a per-row ``tau_plus`` or ``where``; jax or numpy)
  is split along it into contiguous shards (``shared_negatives``, by keyword or
  position, along its own leading axis, which must split evenly; a function around a
  loss that takes them by position must name its parameter ``shared_negatives``, or
  they are split and padded as batch rows), 0-d arrays (a
  learnable temperature) are replicated, other keywords are passed through as static
  values (``matryoshka_dims`` / ``matryoshka_weights`` held as arrays as tuples), and
  ``loss_fn(..., axis_name=axis_name)`` runs once per device under ``jax.shard_map``.
  Arrays that are neither (a model's parameters, as in ``grad_cache``'s recipe) are
  closed over by ``loss_fn``, not passed.
  A global batch that does not split evenly is padded with removed rows: zero rows
  and a ``where=`` mask (combined with the caller's), so the loss is that of the
  batch as given (``loss_fn`` must take ``where=``, as every loss here does).
  An option held as a numpy array (a per-row ``tau_plus``, a 0-d temperature) is
  split or replicated, so traced: out of range, it gives a NaN loss where the loss
  alone raises (docs/math.md §7).
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
    ValueError: an axis the mesh does not have, or array arguments whose leading axes
      differ (``shared_negatives`` aside); the loss's own errors name the global shapes.
  """
  axes = _mesh_axes(mesh, axis_name)
  size = math.prod(mesh.shape[a] for a in axes)
  batch = P(axes[0] if len(axes) == 1 else axes)
  explicit = any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))

  def run(args, arrays, static: _Static):
    kw = dict(static.items)
    whole = lambda a, k: loss_fn(*a, **k, **kw, axis_name=None)
    # The global batch on one device: the loss's own errors name the shapes the caller
    # passed.
    abstract = lambda v: jax.ShapeDtypeStruct(np.shape(v), jnp.result_type(v))
    out_global = jax.eval_shape(whole, *jax.tree.map(abstract, (args, arrays)))
    named = _named(loss_fn, args, {k: v for k, v in arrays.items() if k not in _COLUMNS})
    n = next((np.shape(v)[0] for _, v in named if np.ndim(v) > 0), 0)
    for name in _COLUMNS:   # columns of every row, split by their own leading axis
      if name in arrays and np.shape(arrays[name])[0] % size:
        raise ValueError(f"{name} with shape {np.shape(arrays[name])} does not split into "
                         f"{size} equal shards along mesh axis {axis_name!r}: pass a "
                         f"multiple of {size} rows")
    for name, v in named:
      if np.ndim(v) > 0 and np.shape(v)[0] != n:
        raise ValueError(f"{name} with shape {np.shape(v)} does not share the leading batch "
                         f"axis of the other arrays ({n}): every array argument is split "
                         f"along the batch but shared_negatives (by that name); close over "
                         f"the others (parameters) instead of passing them")
    pad = -n % size
    if pad:   # removed rows make the batch split evenly
      if not _takes_where(loss_fn):
        raise ValueError(f"a global batch of {n} does not split into {size} equal shards "
                         f"along mesh axis {axis_name!r}, and loss_fn takes no where= to "
                         f"mask padding rows")
      keep = arrays.get("where", np.ones((n,), bool))
      arrays = dict(arrays, where=keep)
      grow = lambda v: v if np.ndim(v) == 0 else jnp.pad(
          jnp.asarray(v), [(0, pad)] + [(0, 0)] * (np.ndim(v) - 1))
      cols = {k: arrays.pop(k) for k in _COLUMNS if k in arrays}
      args, arrays = jax.tree.map(grow, (args, arrays))
      arrays.update(cols)
      out_global = jax.eval_shape(whole, *jax.tree.map(abstract, (args, arrays)))
    # The per-row outputs: those whose shape follows the batch (probed at twice it).
    double = lambda v: jax.ShapeDtypeStruct(
        (2 * np.shape(v)[0],) + np.shape(v)[1:] if np.ndim(v) else (), jnp.result_type(v))
    out_double = jax.eval_shape(whole, *jax.tree.map(double, (args, arrays)))
    out_specs = jax.tree.map(lambda g, l: _out_spec(g.shape, l.shape, batch), out_global,
                             out_double)
    in_specs = jax.tree.map(lambda v: batch if np.ndim(v) else P(), (args, arrays))
    if explicit:   # Explicit axes: shard_map wants its inputs typed with in_specs
      args, arrays = jax.tree.map(
          lambda v, s: jax.sharding.reshard(v, NamedSharding(mesh, s)), (args, arrays),
          in_specs)
    per_shard = lambda a, k: loss_fn(*a, **k, **kw, axis_name=axis_name)
    # check_vma=True: JAX tracks which values vary over the axes, which is what makes
    # a replicated loss differentiate to the global loss's local gradient (and lets the
    # losses reject replicated inputs).
    out = jax.shard_map(per_shard, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                        check_vma=True)(args, arrays)
    if not pad:
      return out
    # Per-row outputs lose the padding rows again (Explicit axes: replicated first, as
    # n rows do not split evenly).
    def trim(v, spec):
      if spec == P():
        return v
      if explicit:
        v = jax.sharding.reshard(v, NamedSharding(mesh, P()))
      return lax.slice_in_dim(v, 0, n, axis=len(spec) - 1)

    leaves, tree = jax.tree.flatten(out)
    specs = jax.tree.leaves(out_specs, is_leaf=lambda v: isinstance(v, P))
    return jax.tree.unflatten(tree, [trim(v, s) for v, s in zip(leaves, specs)])

  # jit: custom_vjp(symbolic_zeros) under an eager shard_map is not implemented in JAX,
  # and one compile serves every later call with the same static keywords.
  jitted = jax.jit(run, static_argnums=2)

  def f(*args, **kwargs):
    args, kwargs = _columns_by_keyword(loss_fn, args, kwargs)
    kwargs = {k: _static_sequence(v) if k in _STATIC_SEQUENCES else v
              for k, v in kwargs.items()}
    arrays = {k: v for k, v in kwargs.items() if _is_array(v)}
    static = _Static(tuple(sorted(((k, v) for k, v in kwargs.items() if k not in arrays),
                                  key=lambda kv: kv[0])))
    return jitted(args, arrays, static)

  return f


# Keyword arrays that are columns of every row, not batch rows: split over the devices
# by their own leading axis (each device's shard joins the global column set).
_COLUMNS = ("shared_negatives",)


# Keywords that are static sequences (one entry per Matryoshka dim), which a caller may
# hold as a NumPy or concrete jax array, as the losses accept them: passed on as tuples.
_STATIC_SEQUENCES = ("matryoshka_dims", "matryoshka_weights")


def _static_sequence(v):
  if not _is_array(v):
    return v
  try:
    return tuple(np.asarray(v).tolist())
  except jax.errors.JAXTypeError:   # traced: the loss's own error names it
    return v


def _parameters(loss_fn) -> list | None:
  """``loss_fn``'s parameters, or None where its signature cannot be read."""
  try:
    return list(inspect.signature(loss_fn).parameters.values())
  except (TypeError, ValueError):
    return None


def _positional(loss_fn) -> list:
  """The parameters ``loss_fn`` takes by position, in order ([] where its signature
  cannot be read)."""
  return [p for p in _parameters(loss_fn) or ()
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _columns_by_keyword(loss_fn, args, kwargs):
  """A column array passed positionally (``qwen3_loss(q, d, None, shared)``) moved to
  the keywords, with every positional argument after it, by their names."""
  params = _positional(loss_fn)[:len(args)]
  cut = next((i for i, p in enumerate(params) if p.name in _COLUMNS), None)
  if cut is None or len(args) > len(params) or any(
      p.kind == p.POSITIONAL_ONLY or p.name in kwargs for p in params[cut:]):
    return args, kwargs   # (the loss's own call then says what is wrong)
  return args[:cut], dict(kwargs, **{p.name: a for p, a in zip(params[cut:], args[cut:])})


def _takes_where(loss_fn) -> bool:
  params = _parameters(loss_fn)
  if params is None:
    return True   # let the call tell
  return any(p.name == "where" or p.kind == p.VAR_KEYWORD for p in params)


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
  params = [p.name for p in _positional(loss_fn)]
  named = [(params[i] if i < len(params) else f"positional argument {i}", a)
           for i, a in enumerate(args)]
  named += list(arrays.items())
  return [(name, leaf) for name, v in named for leaf in jax.tree.leaves(v)]


def _out_spec(global_shape, local_shape, batch: P) -> P:
  """The output's batch axis is the one that follows the batch (none: replicated)."""
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
