"""Two MLP towers for the grad_cache tests (CPU and GPU): parameters, a batch, the
chunk embedding with dropout, a family's loss over embeddings, the plain oracle
(``jax.value_and_grad`` through every chunk's embeddings, concatenated) and the
comparison of (value, gradients) pairs."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.support.families import FAMILIES

FEAT, HID, EMB, K = 6, 10, 8, 2   # input features, hidden width, embedding dim, hard negs


def mlp(ws, h, drop_key=None):
  for j, w in enumerate(ws):
    h = h @ w
    if j < len(ws) - 1:
      h = jnp.tanh(h)
      if drop_key is not None:   # dropout at rate 0.25 after each hidden layer
        keep = jax.random.bernoulli(jax.random.fold_in(drop_key, j), 0.75, h.shape)
        h = jnp.where(keep, h / 0.75, 0)
  return h


def params(dtype, towers=("a", "b")):
  keys = jax.random.split(jax.random.key(1), 2 * len(towers))
  p = {t: [jax.random.normal(keys[2 * i], (FEAT, HID), dtype) / 2,
           jax.random.normal(keys[2 * i + 1], (HID, EMB), dtype) / 3]
       for i, t in enumerate(towers)}
  p["log_scale"] = jnp.asarray(np.log(1 / 0.1), dtype)   # a learnable temperature
  return p


def batch(n, dtype, hard=False):
  ka, kb, kh = jax.random.split(jax.random.key(2), 3)
  b = {"a": jax.random.normal(ka, (n, FEAT), dtype), "b": jax.random.normal(kb, (n, FEAT), dtype)}
  if hard:
    b["h"] = jax.random.normal(kh, (n, K, FEAT), dtype)
  return b


def embed(p, chunk, key, dropout=True):
  ka = kb = None
  if key is not None and dropout:
    ka, kb = jax.random.split(key)
  e = {"a": mlp(p["a"], chunk["a"], ka), "b": mlp(p["b"], chunk["b"], kb)}
  if "h" in chunk:   # hard negatives through the document tower, [rows, K, EMB]
    e["h"] = mlp(p["b"], chunk["h"], None if kb is None else jax.random.fold_in(kb, 7))
  if "keep" in chunk:
    e["keep"] = chunk["keep"]
  return e


# family -> the loss of an embeddings dict (a: rows, b: columns, h: hard negatives).
_LOSSES = {name: (lambda e, _f=f, **kw: _f.loss(*[e[k] for k in "abh"[:_f.n_arrays]], **kw))
           for name, f in FAMILIES.items()}


def loss(family, backend="blockwise", **kw):
  def loss_fn(p, e):
    if "keep" in e:
      kw["where"] = e["keep"]
    return _LOSSES[family](e, temperature=jnp.exp(-p["log_scale"]), backend=backend, **kw)
  return loss_fn


def plain(embed_fn, loss_fn, chunk, has_aux=False):
  """The oracle: value_and_grad through every chunk's embeddings, concatenated."""
  def step(params, batch, rng=None):
    n = jax.tree.leaves(batch)[0].shape[0]
    def whole(p):
      parts = [embed_fn(p, jax.tree.map(lambda a: a[s:s + chunk], batch),
                        None if rng is None else jax.random.fold_in(rng, i))
               for i, s in enumerate(range(0, n, chunk))]
      return loss_fn(p, jax.tree.map(lambda *v: jnp.concatenate(v), *parts))
    return jax.value_and_grad(whole, has_aux=has_aux)(params)
  return step


def assert_close(got, want, tol, trained=("a", 0)):
  (v, g), (v_ref, g_ref) = got, want
  assert abs(float(v) - float(v_ref)) <= tol * max(1.0, abs(float(v_ref))), (v, v_ref)
  for path, a, b in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree.leaves(g),
                        jax.tree.leaves(g_ref)):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err = np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)
    assert err <= tol, (path[0], err)
  assert np.max(np.abs(np.asarray(g_ref[trained[0]][trained[1]]))) > 0   # a trained tower's
