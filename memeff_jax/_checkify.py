"""Traced values: checks that cannot raise, and the switch that makes checkify name them.

Values inside traced arrays cannot be checked without a host sync: ``value_checks``
turns them into one 0-d ``ok`` (the chain then poisons the loss and its gradients
with NaN, ``_terms.poison`` and ``_terms.taint``) and, inside ``checkify_checks``,
a ``checkify.debug_check`` per argument. Each option's range is its row's in the
options table (``_options``).
"""

from __future__ import annotations

import contextlib
import os
import threading

import jax.numpy as jnp
from jax.experimental import checkify

from memeff_jax._compat import env_switch
from memeff_jax._options import OPTIONS
from memeff_jax._validation import _is_python_number, check_flag


_DEFAULT = env_switch(os.environ.get("MEMEFF_JAX_CHECKIFY"))
_LOCAL = threading.local()   # .enabled: set by the calling thread's checkify_checks blocks


def _enabled() -> bool:
  return getattr(_LOCAL, "enabled", _DEFAULT)


@contextlib.contextmanager
def checkify_checks(enabled: bool = True):
  """Losses traced inside this block name a bad traced value under ``checkify``.

  Outside it (the default), a traced hyperparameter out of range or a non-finite
  feature gives a NaN loss and NaN gradients and nothing else. Inside, each of
  those checks is also a ``jax.experimental.checkify.debug_check`` naming the
  argument, so ``checkify.checkify(step)`` returns an error that says which one
  (a no-op without ``checkify``). The checks are off by default because a
  ``debug_check`` gives the traced program an effect, and a jitted function with
  an effect leaves JAX's C++ dispatch path for the Python one: about 1.3 ms more
  host time per call of a loss step on an H200 machine (benchmarks/NOTES.md).

  The switch is read when a loss is traced: a function jitted (and traced) before
  the block keeps its trace. The block is the calling thread's, as jax.config's
  context managers are: another thread tracing meanwhile is not affected.
  ``MEMEFF_JAX_CHECKIFY=1`` in the environment turns the checks on for the whole
  process, in every thread (``0``, ``false``, ``no``, ``off`` or empty: off).
  ``enabled=False`` turns them off inside the block (a bool), that variable included.

  Example::

    with memeff_jax.checkify_checks():
      err, loss = checkify.checkify(loss_fn)(x, y, temperature)
    err.throw()   # "temperature must be > 0 and, with 1 / temperature, a normal
                  #  number of its dtype, got temperature=-0.1"
  """
  check_flag("enabled", enabled)
  old, _LOCAL.enabled = _enabled(), enabled
  try:
    yield
  finally:
    _LOCAL.enabled = old


def _debug_check(ok, msg, **kw):
  if _enabled():
    checkify.debug_check(ok, msg, **kw)


def value_checks(arrays: dict, hyper: dict):
  """0-d bool: every array in ``arrays`` (name -> array or None) is finite and every
  traced hyperparameter in ``hyper`` (name -> value; Python numbers were checked at
  trace time) lies in its range (the options table's). None when there is nothing to check. Inside
  ``checkify_checks``, each check is also a ``checkify.debug_check`` naming the
  argument."""
  oks = []
  for name, v in arrays.items():
    if v is None:
      continue
    ok = jnp.all(jnp.isfinite(v))
    _debug_check(ok, f"{name} must be finite: it holds NaN or inf")
    oks.append(ok)
  for name, v in hyper.items():
    if v is None or _is_python_number(v):
      continue
    fn, what = OPTIONS[name].traced
    ok = jnp.all(fn(v))
    if jnp.ndim(v) == 0:
      # (6 significant digits: a float32 -0.1 reads -0.1, not -0.10000000149011612)
      _debug_check(ok, f"{name} must be {what}, got {name}={{v:.6g}}", v=v)
    else:
      _debug_check(ok, f"{name} must be {what} in every entry, got {name}.shape="
                       f"{jnp.shape(v)} with an entry out of range or NaN")
    oks.append(ok)
  if not oks:
    return None
  return jnp.all(jnp.stack(oks))

