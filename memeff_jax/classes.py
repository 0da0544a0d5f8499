"""memeff's class names, for porting PyTorch code: thin frozen-dataclass callables.

Each class holds memeff's constructor options and calls one function of this
package; nothing here computes anything. The mapping (docs/math.md §10 lists where
the math differs from memeff):

==============================================  ===============================================
memeff class                                    memeff_jax call
==============================================  ===============================================
``MemoryEfficientCLIPLoss``                     :func:`memeff_jax.clip_loss`
``MemoryEfficientLiTLoss``                      :func:`memeff_jax.lit_loss`
``MemoryEfficientQwen3Loss``                    :func:`memeff_jax.qwen3_loss`
``MemoryEfficientLiTQwen3Loss``                 :func:`memeff_jax.lit_qwen3_loss`
``MemoryEfficientMatryoshka<X>Loss``            the same function with ``matryoshka_dims=dims``,
                                                ``matryoshka_weights=weights``
``DistributedMemoryEfficient<...>Loss``         the same with ``axis_name=``, inside
                                                ``jax.shard_map`` (or use ``memeff_jax.sharded``)
``MatryoshkaLoss(base_loss, dims, weights)``    :func:`memeff_jax.matryoshka`
``StableMemoryEfficient{CLIP,LiT}Loss``         deprecated: ``clip_loss`` / ``lit_loss``,
                                                ``stable=True``
==============================================  ===============================================

Options are keyword-only (memeff's constructors take keywords in its examples too);
every class also takes ``backend=`` ("auto" by default). Values are validated when
the loss is called, by the function, not at construction; the Matryoshka classes'
``dims`` and ``weights`` are checked when the object is built. Every call returns the
function's result: a float32 scalar (float64 for float64 inputs, with x64 enabled, on
the blockwise and reference backends).

The ``Distributed*`` classes differ from memeff's in what they return: memeff's
forward returns this rank's additive share of the loss (all-reduce it to log it) and
relies on DDP averaging gradients over W ranks. Here every device returns the
**global** loss, and ``jax.grad`` inside ``shard_map`` gives each device the local
rows of the global loss's gradient, with no ``1 / W`` factor (docs/math.md §9).

The classes are built from one spec per family (``_wrappers.SPECS``), their defaults
from the options table (``_options``); their docstrings are generated.

Example:
  >>> import jax
  >>> from memeff_jax import clip_loss
  >>> from memeff_jax.classes import MemoryEfficientCLIPLoss
  >>> kx, ky = jax.random.split(jax.random.key(0))
  >>> x = jax.random.normal(kx, (8, 16)); y = jax.random.normal(ky, (8, 16))
  >>> loss_fn = MemoryEfficientCLIPLoss(temperature=0.05, backend="blockwise")
  >>> bool(loss_fn(x, y) == clip_loss(x, y, temperature=0.05, backend="blockwise"))
  True
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, ClassVar, Hashable

import jax
from jax.typing import ArrayLike

import memeff_jax
from memeff_jax._options import OPTIONS
from memeff_jax._validation import check_loss
from memeff_jax._wrappers import (CALL_DOC, MEMEFF_ARRAYS, SPECS, Spec, call_loss, call_method,
                                  fill, matryoshka_options)

__all__ = [
    "DistributedMemoryEfficientCLIPLoss",
    "DistributedMemoryEfficientLiTLoss",
    "DistributedMemoryEfficientLiTQwen3Loss",
    "DistributedMemoryEfficientMatryoshkaCLIPLoss",
    "DistributedMemoryEfficientMatryoshkaLiTLoss",
    "DistributedMemoryEfficientMatryoshkaLiTQwen3Loss",
    "DistributedMemoryEfficientMatryoshkaQwen3Loss",
    "DistributedMemoryEfficientQwen3Loss",
    "MatryoshkaLoss",
    "MemoryEfficientCLIPLoss",
    "MemoryEfficientLiTLoss",
    "MemoryEfficientLiTQwen3Loss",
    "MemoryEfficientMatryoshkaCLIPLoss",
    "MemoryEfficientMatryoshkaLiTLoss",
    "MemoryEfficientMatryoshkaLiTQwen3Loss",
    "MemoryEfficientMatryoshkaQwen3Loss",
    "MemoryEfficientQwen3Loss",
    "StableMemoryEfficientCLIPLoss",
    "StableMemoryEfficientLiTLoss",
]

# memeff's constructor options (in this order), then the family's own; the rest of the
# functions' options (lse_square_scale, axis_name, ...) are not memeff's.
_OPTIONS = ("temperature", "normalized_inputs", "stable", "tau_plus", "label_smoothing",
            "backend")
_OWN = ("margin", "use_qq_negatives", "use_dd_negatives")   # memeff's of the families


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Wrapper:
  """Calls the family's loss with every dataclass field as a keyword."""

  _spec: ClassVar[Spec]
  _fixed: ClassVar[dict[str, Any]] = {}

  def _call(self, *arrays, tau_plus, where=None) -> jax.Array:
    opts = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    temperature = opts.pop("temperature")
    if "dims" in opts:   # memeff's names for the fused Matryoshka options
      opts["matryoshka_dims"] = opts.pop("dims")
      opts["matryoshka_weights"] = opts.pop("weights")
    opts.update(self._fixed)
    return call_loss(self._spec.loss, arrays, temperature=temperature, options=opts,
                     tau_plus=tau_plus, where=where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _MatryoshkaOptions:
  dims: tuple[int, ...]
  weights: tuple[float, ...] | None = None

  def __post_init__(self):
    # Checked tuples (errors name dims / weights), as the frozen fields.
    dims, weights = matryoshka_options(self.dims, self.weights, ("dims", "weights"),
                                       required=True)
    object.__setattr__(self, "dims", dims)
    object.__setattr__(self, "weights", weights)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _DistributedOptions:
  axis_name: Hashable


def _call_doc(spec: Spec) -> str:
  arrays = "\n".join(f"  {a}: {doc}" for a, doc in spec.arrays.items())
  return f"""The loss of {spec.what}: a float32 scalar (float64 for float64 features).

Args:
{arrays}
{CALL_DOC}"""


def _dataclass(name: str, bases: tuple, doc: str, fields=(), **namespace) -> type:
  return dataclasses.make_dataclass(
      name, fields, bases=bases, frozen=True, kw_only=True,
      namespace=dict(namespace, __module__=__name__, __qualname__=name, __doc__=doc))


_MRL_DOC = """
  How it runs is the function's default (``matryoshka_per_dim=None``): on a GPU, one
  plain block per dim (16-bit inputs, and fp32 up to a padded feature size of 256),
  else one block whose feature pass serves every dim. Same loss.

  Attributes:
    dims: strictly increasing prefix sizes, the last equal to the feature size (passed
      as ``matryoshka_dims``). memeff also needs multiples of 64; any sizes work here.
    weights: optional per-dim weights (``matryoshka_weights``; default 1 each, not
      normalized: the loss is the weighted sum).
    The other options: as for the plain class.
"""

_DIST_DOC = """
  Call it inside ``jax.shard_map`` with this device's contiguous shard of every array
  (hard negatives and per-row ``tau_plus`` stay with their query). Unlike memeff's
  per-rank share, every device gets the **global** loss; gradients are the local
  rows of the global loss's gradient (docs/math.md §9). Holding global arrays
  instead? ``memeff_jax.sharded(<function>, mesh, axis_name)``.

  Attributes:
    axis_name: the mesh axis the batch is sharded over (memeff: the process group).
    The other options: as for the single-device class.
"""


def _family(spec: Spec) -> tuple[type, type, type, type]:
  """A family's four classes: plain, fused Matryoshka, and their Distributed twins."""
  fn, names = spec.function, _OPTIONS + tuple(o for o in spec.options if o in _OWN)
  plain_name = f"MemoryEfficient{spec.tag}Loss"
  about = f"\n\n{fill(spec.about)}" if spec.about else ""
  # (each class its own __call__, so that Python's argument errors name the class)
  call = lambda owner: call_method(spec, _Wrapper._call, "__call__", _call_doc(spec), owner)
  plain = _dataclass(
      plain_name, (_Wrapper,),
      fill(f"memeff's ``{plain_name}``: :func:`memeff_jax.{fn}` (docs/math.md "
           f"{spec.section}).").lstrip() + about + "\n\n  Attributes:\n" +
      fill(f"{', '.join(names)}: as for :func:`memeff_jax.{fn}` (a float temperature; "
           f"for a learnable one call the function with a traced array, or use "
           f"``memeff_jax.nnx.{spec.tag}Loss``).", "    ") + "\n",
      [(n, OPTIONS[n].type, dataclasses.field(default=OPTIONS[n].default)) for n in names],
      _spec=spec, __call__=call(plain_name))
  mrl_name = f"MemoryEfficientMatryoshka{spec.tag}Loss"
  mrl = _dataclass(mrl_name, (_MatryoshkaOptions, plain), fill(
      f"memeff's fused ``{mrl_name}``: :func:`memeff_jax.{fn}` with "
      f"``matryoshka_dims=dims, matryoshka_weights=weights`` (docs/math.md §8.1).").lstrip()
      + "\n" + _MRL_DOC, __call__=call(mrl_name))
  dist = [_dataclass(f"Distributed{c.__name__}", (_DistributedOptions, c), fill(
      f"memeff's ``Distributed{c.__name__}``: :func:`memeff_jax.{fn}` with " +
      ("``matryoshka_dims=``, ``matryoshka_weights=`` and " if c is mrl else "") +
      "``axis_name=``.").lstrip() + "\n" + _DIST_DOC, __call__=call(f"Distributed{c.__name__}"))
          for c in (plain, mrl)]
  return plain, mrl, dist[0], dist[1]


# memeff has no SigLIP class, and its calls take no shared negative columns; their hard
# negatives are memeff's forward argument ``hard_negative_features``.
_CLIP, _LIT, _QWEN3, _LIT_QWEN3 = (
    dataclasses.replace(s, arrays={MEMEFF_ARRAYS.get(a, a): d for a, d in s.arrays.items()
                                   if a != "shared_negatives"})
    for s in SPECS[:4])
(MemoryEfficientCLIPLoss, MemoryEfficientMatryoshkaCLIPLoss, DistributedMemoryEfficientCLIPLoss,
 DistributedMemoryEfficientMatryoshkaCLIPLoss) = _family(_CLIP)
(MemoryEfficientLiTLoss, MemoryEfficientMatryoshkaLiTLoss, DistributedMemoryEfficientLiTLoss,
 DistributedMemoryEfficientMatryoshkaLiTLoss) = _family(_LIT)
(MemoryEfficientQwen3Loss, MemoryEfficientMatryoshkaQwen3Loss,
 DistributedMemoryEfficientQwen3Loss,
 DistributedMemoryEfficientMatryoshkaQwen3Loss) = _family(_QWEN3)
(MemoryEfficientLiTQwen3Loss, MemoryEfficientMatryoshkaLiTQwen3Loss,
 DistributedMemoryEfficientLiTQwen3Loss,
 DistributedMemoryEfficientMatryoshkaLiTQwen3Loss) = _family(_LIT_QWEN3)


# --- the eager wrapper -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MatryoshkaLoss:
  """memeff's eager ``MatryoshkaLoss``: :func:`memeff_jax.matryoshka` (docs/math.md §8.3).

  ``MatryoshkaLoss(base_loss, dims, weights)(*arrays, **kwargs)`` is
  ``sum_k w_k * base_loss(*(a[..., :m_k] for a in arrays), **kwargs)``: every prefix
  is renormalized by the base loss, one full loss pass per dim. The slicing is
  :func:`memeff_jax.matryoshka`'s (feature arrays, the hard negatives too, positional or
  ``hard_negative_features=``; never ``tau_plus``). The fused classes (or
  ``matryoshka_dims=``) give the same loss, per-dim statistics and every option applied
  per dim; on a GPU they too run one plain block per dim by default (the functions'
  ``matryoshka_per_dim=``).

  Attributes:
    base_loss: any loss callable: a class of this module or a function such as
      ``functools.partial(memeff_jax.clip_loss, temperature=0.05)``. It must
      normalize its inputs (``normalized_inputs=True`` raises ValueError).
    dims: strictly increasing prefix sizes, ``dims[-1] <= d``.
    weights: optional per-dim weights (default 1 each, not normalized).

  Raises:
    ValueError, TypeError: as :func:`memeff_jax.matryoshka` raises them (a base loss
      that is not callable or has ``normalized_inputs=True``, bad dims or weights), at
      construction.
  """

  base_loss: Callable[..., jax.Array]
  dims: tuple[int, ...]
  weights: tuple[float, ...] | None = None

  def __post_init__(self):
    _MatryoshkaOptions.__post_init__(self)
    check_loss("base_loss", self.base_loss)   # (matryoshka() would name it loss_fn)
    # Checks the base loss (normalized_inputs=True raises, a field or a partial's keyword).
    memeff_jax.matryoshka(self.base_loss, self.dims, weights=self.weights)

  def __call__(self, *arrays: ArrayLike, **kwargs) -> jax.Array:
    """The weighted sum of ``base_loss`` over the prefixes: a float32 scalar (float64
    for float64 features)."""
    return memeff_jax.matryoshka(self.base_loss, self.dims, weights=self.weights)(
        *arrays, **kwargs)


# --- deprecated aliases ----------------------------------------------------------------------


def _warn_deprecated(name: str, replacement: str) -> None:
  # stacklevel 4: warn -> here -> __post_init__ -> the dataclass __init__ -> the caller.
  warnings.warn(f"{name} is deprecated (as in memeff): use {replacement} (stable=True is "
                f"the default)", DeprecationWarning, stacklevel=4)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StableMemoryEfficientCLIPLoss(_Wrapper):
  """Deprecated memeff alias: :func:`memeff_jax.clip_loss` with ``stable=True``.

  Warns ``DeprecationWarning`` on construction. Takes only ``temperature``,
  ``normalized_inputs`` (and ``backend``), as memeff's alias does; use
  :class:`MemoryEfficientCLIPLoss`.
  """

  temperature: float = OPTIONS["temperature"].default
  normalized_inputs: bool = OPTIONS["normalized_inputs"].default
  backend: OPTIONS["backend"].type = OPTIONS["backend"].default

  _spec: ClassVar[Spec] = _CLIP
  _fixed: ClassVar[dict[str, Any]] = {"stable": True}
  __call__ = call_method(_CLIP, _Wrapper._call, "__call__",
                         "As :meth:`MemoryEfficientCLIPLoss.__call__`.",
                         "StableMemoryEfficientCLIPLoss")

  def __post_init__(self):
    _warn_deprecated("StableMemoryEfficientCLIPLoss", "MemoryEfficientCLIPLoss")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StableMemoryEfficientLiTLoss(_Wrapper):
  """Deprecated memeff alias: :func:`memeff_jax.lit_loss` with ``stable=True``.

  Warns ``DeprecationWarning`` on construction. Takes only ``temperature``,
  ``normalized_inputs`` (and ``backend``); use :class:`MemoryEfficientLiTLoss`.
  """

  temperature: float = OPTIONS["temperature"].default
  normalized_inputs: bool = OPTIONS["normalized_inputs"].default
  backend: OPTIONS["backend"].type = OPTIONS["backend"].default

  _spec: ClassVar[Spec] = _LIT
  _fixed: ClassVar[dict[str, Any]] = {"stable": True}
  __call__ = call_method(_LIT, _Wrapper._call, "__call__",
                         "As :meth:`MemoryEfficientLiTLoss.__call__`.",
                         "StableMemoryEfficientLiTLoss")

  def __post_init__(self):
    _warn_deprecated("StableMemoryEfficientLiTLoss", "MemoryEfficientLiTLoss")
