"""Gradient caching: a training step whose encoder memory does not grow with the batch.

The loss here costs O(B) memory at any batch; the encoders that produce its rows do not:
their activations grow with B. Gradient caching (Gao et al., 2021) splits the step in
three (docs/math.md §11):

1. embed the batch chunk by chunk, keeping no activations;
2. take the loss and its gradient with respect to the embeddings over the whole batch;
3. embed each chunk again under ``jax.vjp`` and pull that chunk's embedding gradient
   back to the parameters, accumulating them.

The result is the gradient of the loss of the whole batch, not an average over
micro-batches: every row still competes with every other. Memory is one chunk's
activations plus the embeddings and their gradients; compute is two encoder forwards
and one backward. ``grad_cache`` is the functional form (params pytrees, Linen,
``TrainState``); :func:`memeff_jax.nnx.grad_cache` wraps it for NNX modules.
"""

from __future__ import annotations

import operator
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

from memeff_jax._compat import vary_like, varying_axes
from memeff_jax.config.kernel import is_int

__all__ = ["grad_cache"]


def grad_cache(embed_fn: Callable, loss_fn: Callable, *, chunk_size: int,
               has_aux: bool = False) -> Callable:
  """A training step equal to ``jax.value_and_grad`` of the whole batch's loss, in one
  chunk's encoder memory.

  ``step = grad_cache(embed_fn, loss_fn, chunk_size=c)`` returns
  ``step(params, batch, rng=None) -> (loss, grads)`` (``((loss, aux), grads)`` with
  ``has_aux``), equal to::

    def plain(params):
      E = concatenate([embed_fn(params, chunk_i, key_i) for each chunk], axis=0)
      return loss_fn(params, E)
    jax.value_and_grad(plain, has_aux=has_aux)(params)

  where the chunks are ``batch[i * c:(i + 1) * c]`` (the last one shorter when ``c``
  does not divide the batch), ``key_i = jax.random.fold_in(rng, i)`` (``None`` when
  ``rng`` is ``None``), and the concatenation is leaf by leaf over the embeddings'
  pytree. Chunk ``i`` gets the same key when it is embedded and when it is embedded
  again for its gradient, so dropout is identical in both.

  What it costs: one chunk's activations plus the ``[B, ...]`` embeddings and their
  gradients (the parameter gradients are accumulated in place); two encoder forwards
  and one backward. An embedding whose loss gradient is zero by construction (a locked
  tower: :func:`memeff_jax.lit_loss`'s image features, a tower under
  ``lax.stop_gradient``) is not embedded again. ``step`` traces once per shape: new
  values (a temperature, a new batch of the same size) do not recompile under
  ``jax.jit``.

  Inside ``jax.shard_map`` each device chunks its own shard of ``batch``; give
  ``loss_fn`` the ring loss (``axis_name=``). Parameter gradients are summed over the
  devices once, after the last chunk. Fold ``lax.axis_index`` into ``rng`` for
  per-device dropout. With global arrays, :func:`memeff_jax.sharded` does the
  splitting; build the step inside it, where the axis name is known::

    def per_shard(batch, axis_name):
      loss = functools.partial(my_loss, axis_name=axis_name)
      return grad_cache(embed_fn, loss, chunk_size=c)(params, batch)
    value, grads = jax.jit(lambda b: memeff_jax.sharded(per_shard, mesh, "data")(b))(batch)

  (A batch that does not split evenly over the devices needs ``per_shard`` to take
  ``where=`` and hand it to the loss: ``sharded`` pads with removed rows.)

  Args:
    embed_fn: ``embed_fn(params, chunk, key) -> embeddings``: ``chunk`` is ``batch``
      with ``rows`` rows (every leaf sliced along axis 0), ``embeddings`` any pytree
      of ``[rows, ...]`` arrays (two towers; queries, documents and hard negatives).
    loss_fn: ``loss_fn(params, embeddings) -> loss`` (``(loss, aux)`` with
      ``has_aux``) over the whole batch's embeddings: a memeff_jax loss or any code
      around one. A learnable temperature in ``params`` gets its gradient directly.
    chunk_size: rows per encoder call, a positive int; the encoders' memory is that of
      one such call. Any batch size works: the last chunk may be shorter (it is its
      own call, so it compiles ``embed_fn`` for a second shape).
    has_aux: ``loss_fn`` returns ``(loss, aux)``, as in ``jax.value_and_grad``.

  Returns:
    ``step(params, batch, rng=None)``: ``(loss, grads)``, or ``((loss, aux), grads)``,
    with ``grads`` shaped like ``params``.

  Raises:
    TypeError: ``chunk_size`` not an int (at once); at trace time, ``loss_fn`` not
      returning a ``(loss, aux)`` tuple with ``has_aux`` (as ``jax.value_and_grad``
      raises).
    ValueError: ``chunk_size`` below 1 (at once); at trace time, ``batch``
      leaves with different leading sizes or none, or ``embed_fn`` outputs whose
      leading axis is not the chunk's row count.

  References:
    Gao et al., `Scaling Deep Contrastive Learning Batch Size under Memory Limited
    Setup <https://arxiv.org/abs/2101.06983>`_, 2021.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from memeff_jax import clip_loss, grad_cache
    >>> def embed(p, chunk, key):
    ...   return {"img": jnp.tanh(chunk["img"] @ p["w_img"]),
    ...           "txt": jnp.tanh(chunk["txt"] @ p["w_txt"])}
    >>> def loss(p, e):
    ...   return clip_loss(e["img"], e["txt"], temperature=0.1, backend="blockwise")
    >>> k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
    >>> params = {"w_img": jax.random.normal(k1, (12, 8)),
    ...           "w_txt": jax.random.normal(k2, (10, 8))}
    >>> batch = {"img": jax.random.normal(k3, (20, 12)),
    ...          "txt": jax.random.normal(k4, (20, 10))}
    >>> step = jax.jit(grad_cache(embed, loss, chunk_size=8))
    >>> value, grads = step(params, batch)
    >>> ref, ref_grads = jax.value_and_grad(
    ...     lambda p: loss(p, embed(p, batch, None)))(params)
    >>> bool(jnp.allclose(value, ref, atol=1e-6))
    True
    >>> bool(jnp.allclose(grads["w_img"], ref_grads["w_img"], atol=1e-5))
    True
  """
  chunk_size = check_chunk_size(chunk_size)

  def step(params, batch, rng=None):
    def embed(p, state, chunk, i):
      return embed_fn(p, chunk, None if rng is None else jax.random.fold_in(rng, i)), state

    loss = lambda p, state, e: (loss_fn(p, e), state)
    out, grads, _ = cached_value_and_grad(embed, loss, params, None, batch, chunk_size,
                                          has_aux)
    return out, grads

  return step


def check_chunk_size(chunk_size) -> int:
  """A positive int (a NumPy integer too, as matryoshka_dims takes), as a Python int."""
  if not is_int(chunk_size):
    raise TypeError(f"chunk_size must be an int, got {type(chunk_size).__name__} "
                    f"chunk_size={chunk_size!r}")
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive int, got chunk_size={chunk_size!r}")
  return int(chunk_size)


def cached_value_and_grad(embed: Callable, loss: Callable, params, state, batch,
                          chunk_size: int, has_aux: bool):
  """``(out, grads, state)``: the three passes over a threaded ``state``; ``out`` is the
  loss, or ``(loss, aux)`` with ``has_aux``.

  ``embed(params, state, chunk, i) -> (embeddings, state)`` embeds chunk ``i``, and
  ``loss(params, state, embeddings) -> (out, state)``. The state (NNX's RNG
  counters and batch statistics; ``None`` for the functional form) flows through the
  first pass into the loss; each chunk's gradient pass starts from the state that
  chunk's first pass saw and changes nothing.
  """
  n = _batch_rows(batch)
  full, rem = divmod(n, chunk_size)
  take = lambda start, rows: jax.tree.map(
      lambda a: lax.dynamic_slice_in_dim(a, start, rows), batch)

  # Pass 1: the embeddings, stacked by a scan over the full chunks, then the short
  # last chunk; no activations are kept. (The embeddings themselves make the [n, ...]
  # arrays, so that they carry the embeddings' sharding: zeros made here would take
  # the context's mesh, which unplaced inputs under jax.set_mesh do not have.)
  _embed_shapes(embed, params, state, take(0, chunk_size if full else rem),
                chunk_size if full else rem)
  pieces, states = [], None
  if full:
    def first(st, i):
      e, new = embed(params, st, take(i * chunk_size, chunk_size), i)
      return new, (e, st)

    state, (stacked, states) = lax.scan(first, state, jnp.arange(full))
    pieces.append(jax.tree.map(lambda v: v.reshape((n - rem,) + v.shape[2:]), stacked))
  state_rem = state
  if rem:
    e, state = embed(params, state, take(full * chunk_size, rem), full)
    pieces.append(e)
  buffers = pieces[0] if len(pieces) == 1 else jax.tree.map(
      lambda *v: jnp.concatenate(v), *pieces)

  # Pass 2: the loss and its gradients with respect to params and the (floating)
  # embeddings; integer and bool leaves (a where= mask carried along) have none.
  leaves, tree = jax.tree.flatten(buffers)
  floats = [jnp.issubdtype(v.dtype, jnp.inexact) for v in leaves]

  state_in = state

  def loss_of(p, float_leaves):   # (loss, (aux, state))
    it = iter(float_leaves)
    e = jax.tree.unflatten(tree, [next(it) if f else v for v, f in zip(leaves, floats)])
    out, st = loss(p, state_in, e)
    if not has_aux:
      return out, (None, st)
    if not (isinstance(out, tuple) and len(out) == 2):   # as jax.value_and_grad checks
      got = (f"a {len(out)}-element {type(out).__name__}" if isinstance(out, (tuple, list))
             else f"{type(out).__name__} of shape {jnp.shape(out)}")
      raise TypeError(f"loss_fn must return a (loss, aux) tuple with has_aux=True, got {got}")
    return out[0], (out[1], st)

  float_leaves = [v for v, f in zip(leaves, floats) if f]
  (value, (aux, state_out)), (grads, emb_grads) = jax.value_and_grad(
      loss_of, argnums=(0, 1), has_aux=True)(params, float_leaves)

  # Pass 3: embed each chunk again and pull its embedding gradient back to params. The
  # embeddings whose gradient is zero by construction (a locked tower) are left out,
  # so XLA drops their recomputation.
  live = _live_leaves(loss_of, params, float_leaves)
  out = (value, aux) if has_aux else value
  if not any(live):
    return out, grads, state_out
  # Per parameter leaf, the mesh axes its chunks' gradients are summed over at the end:
  # those the batch varies over and it does not (a replicated bias or temperature sums
  # over the data axis; an FSDP shard gathered in embed_fn varies with the batch, and
  # its vjp sums its own).
  batch_axes = _vma(batch)
  p_leaves, p_tree = jax.tree.flatten(params)
  axes = [tuple(sorted(batch_axes - varying_axes(v), key=str)) for v in p_leaves]
  p_local = vary_like(params, batch)

  def pull(acc, st, start, rows, i):
    chunk = take(start, rows)
    g = [lax.dynamic_slice_in_dim(v, start, rows) for v, keep in zip(emb_grads, live)
         if keep]

    def kept(p):
      e = [v for v, f in zip(jax.tree.leaves(embed(p, st, chunk, i)[0]), floats) if f]
      return [v for v, keep in zip(e, live) if keep]

    _, vjp = jax.vjp(kept, p_local)
    return jax.tree.map(operator.add, acc, vjp(g)[0])

  # A leaf's accumulator starts from the loss's own gradient (a learnable
  # temperature's), or, where it is summed over devices at the end, from zeros.
  g_leaves = p_tree.flatten_up_to(grads)
  acc = p_tree.unflatten([jnp.zeros_like(v) if ax else g for v, g, ax in
                          zip(p_tree.flatten_up_to(p_local), g_leaves, axes)])
  if full:
    acc = lax.fori_loop(
        0, full, lambda i, a: pull(a, jax.tree.map(operator.itemgetter(i), states),
                                   i * chunk_size, chunk_size, i), acc)
  if rem:
    acc = pull(acc, state_rem, full * chunk_size, rem, full)
  # One all-reduce per set of axes, after the last chunk.
  acc = p_tree.flatten_up_to(acc)
  for ax in sorted(set(axes) - {()}, key=str):
    ks = [k for k, a in enumerate(axes) if a == ax]
    for k, v in zip(ks, lax.psum([acc[k] for k in ks], ax)):
      acc[k] = g_leaves[k] + v
  return out, p_tree.unflatten(acc), state_out


def _batch_rows(batch) -> int:
  leaves = jax.tree.leaves(batch)
  sizes = {jnp.shape(a)[0] if jnp.ndim(a) else None for a in leaves}
  if not leaves or None in sizes or len(sizes) != 1 or 0 in sizes:
    shapes = jax.tree.map(jnp.shape, batch)
    raise ValueError(f"batch leaves must share a leading batch axis of at least one row, "
                     f"got shapes {shapes}")
  return sizes.pop()


def _embed_shapes(embed, params, state, chunk, rows: int):
  """The embeddings' shapes for a chunk of ``rows`` rows, checked to lead with it."""
  out = jax.eval_shape(lambda p, s, c: embed(p, s, c, 0)[0], params, state, chunk)
  leaves = jax.tree.leaves(out)
  if not leaves or any(not v.shape or v.shape[0] != rows for v in leaves):
    shapes = jax.tree.map(lambda v: v.shape, out)
    raise ValueError(f"embed_fn must return a pytree of [rows, ...] arrays, rows being "
                     f"the chunk's {rows}; got shapes {shapes}")
  return out


def _live_leaves(loss_of, params, leaves) -> list[bool]:
  """Per embedding leaf: whether the loss's gradient for it can be nonzero (False
  where the traced gradient is a zero constant, as a locked tower's is)."""
  grad = lambda p, e: jax.grad(lambda e: loss_of(p, e)[0])(e)
  closed = jax.make_jaxpr(grad)(params, leaves)
  return [not _is_zero(closed.jaxpr, v) for v in closed.jaxpr.outvars]


def _is_zero(jaxpr, var) -> bool:
  if isinstance(var, jex_core.Literal):
    return not np.any(np.asarray(var.val))
  for eqn in jaxpr.eqns:
    if var in eqn.outvars:
      if eqn.primitive.name in ("broadcast_in_dim", "convert_element_type", "reshape",
                                "pvary", "pcast"):   # (inside shard_map: varying)
        return _is_zero(jaxpr, eqn.invars[0])
      return False
  return False


def _vma(tree) -> frozenset:
  """Inside shard_map: the mesh axes some leaf of ``tree`` varies over."""
  return frozenset().union(*map(varying_axes, jax.tree.leaves(tree)))
