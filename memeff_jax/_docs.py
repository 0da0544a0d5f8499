"""Docstring pieces of the public losses: each loss's ``Args:`` and ``Raises:`` sections
are assembled from its signature and the options table (``_options``), where every
option is documented once."""

from __future__ import annotations

import inspect
import textwrap

from memeff_jax._options import OPTIONS, TABLE


def args(fn, arrays: dict[str, str]) -> str:
  """The ``Args:`` section of ``fn``: its arrays (docs given here), then each keyword
  option, documented in the options table (``{default}``: the signature's), in
  signature order."""
  lines = ["Args:"]
  for name, p in inspect.signature(fn).parameters.items():
    doc = arrays[name] if name in arrays else OPTIONS[name].doc.replace(
        "{default}", repr(p.default))
    lines.append(f"  {name}: " + textwrap.dedent("      " + doc).strip().replace(
        "\n", "\n    "))
  return "\n".join(lines)


def raises(fn) -> str:
  """The ``Raises:`` section of ``fn``: the arrays' errors, then each of its options'
  (their table rows' fragments), and what a traced value out of range gives."""
  names = inspect.signature(fn).parameters
  rows = [o for o in TABLE if o.name in names]
  frags = lambda exc: "".join(dict.fromkeys(
      f", {text}" for o in rows for e, text in o.raises if e is exc))
  ranges = ", ".join(f"``{o.name}`` {o.traced.what}" for o in rows if o.traced)
  fill = lambda text, indent: textwrap.fill(text, 86, initial_indent=indent,
                                            subsequent_indent=indent + "  ")
  return "\n".join([
      "Raises:",
      fill(f"ValueError: bad shapes{frags(ValueError)}.", "  "),
      fill(f"TypeError: non-floating, unsupported (float8, ...) or mismatched dtypes"
           f"{frags(TypeError)}; forward-mode differentiation (``jax.jvp``, "
           f"``jax.jacfwd``) but on the reference with features other than float16.", "  "),
      "  NotImplementedError: ``vmap`` / ``jacrev`` / grad-of-grad over the Triton backends.",
      "",
      textwrap.fill(
          f"Traced values cannot raise: a traced hyperparameter out of its range "
          f"({ranges}) or a non-finite feature gives a NaN loss and NaN gradients on "
          f"every backend, never a finite value; traced inside "
          f":func:`memeff_jax.checkify_checks`, ``jax.experimental.checkify.checkify`` "
          f"also returns an error naming the argument.", 86)])


RETURNS = """Returns:
  float32 scalar (float64 for float64 features): the mean loss (with
  ``matryoshka_dims``, the weighted sum over the dims), smoothing and z-loss included."""

STATS = """Returns ``(loss, stats)``: the loss of :func:`{name}` and its
:class:`memeff_jax.ContrastiveStats` (z-loss, log-normalizers, per-dim Matryoshka losses)."""


# The ``shared_negatives`` array of the row-softmax losses (its ``Args:`` entry).
SHARED_NEGATIVES = """optional [n_negatives, d], same dtype: columns that every row
      competes against besides the batch's (sentence-transformers' hard-negative
      columns, a negative queue or a precomputed corpus: MoCo-style memory banks),
      streamed by the kernels as one more block, O(n_negatives d) memory. Trained with
      the second tower (locked where it is). In a ring, each device's own shard: the
      global column set is every device's, as sentence-transformers'
      ``gather_across_devices`` (a copy on every device would count each column once
      a device, and raises). ``where`` does not apply to them."""
