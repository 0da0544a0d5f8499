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
the loss is called, by the function, not at construction. Every call returns the
function's result: a float32 scalar (float64 for float64 inputs, with x64 enabled, on
the blockwise and reference backends).

The ``Distributed*`` classes differ from memeff's in what they return: memeff's
forward returns this rank's additive share of the loss (all-reduce it to log it) and
relies on DDP averaging gradients over W ranks. Here every device returns the
**global** loss, and ``jax.grad`` inside ``shard_map`` gives each device the local
rows of the global loss's gradient, with no ``1 / W`` factor (docs/math.md §9).

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
from memeff_jax._validation import check_dims, check_weights
from memeff_jax._wrappers import call_loss
from memeff_jax.backends.registry import BackendName as Backend


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Wrapper:
  """Calls ``memeff_jax.<_function>`` with every dataclass field as a keyword."""

  _function: ClassVar[str]
  _fixed: ClassVar[dict[str, Any]] = {}

  def _call(self, *arrays, tau_plus, where=None) -> jax.Array:
    opts = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    temperature = opts.pop("temperature")
    if "dims" in opts:   # memeff's names for the fused Matryoshka options
      opts["matryoshka_dims"] = opts.pop("dims")
      opts["matryoshka_weights"] = opts.pop("weights")
    opts.update(self._fixed)
    # Looked up at call time: the package's public functions, whatever module holds them.
    fn = getattr(memeff_jax, self._function)
    return call_loss(fn, arrays, temperature=temperature, options=opts,
                     tau_plus=tau_plus, where=where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Options(_Wrapper):
  temperature: float = 0.07
  normalized_inputs: bool = False
  stable: bool = True
  tau_plus: float = 0.0
  label_smoothing: float = 0.0
  backend: Backend = "auto"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _LiTQwen3Options(_Options):
  margin: float = 0.1
  use_qq_negatives: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Qwen3Options(_LiTQwen3Options):
  use_dd_negatives: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class _MatryoshkaOptions:
  dims: tuple[int, ...]
  weights: tuple[float, ...] | None = None

  def __post_init__(self):
    _checked_dims(self)


def _checked_dims(obj) -> None:
  """A frozen dataclass's ``dims`` and ``weights`` as checked tuples (errors name them)."""
  object.__setattr__(obj, "dims", check_dims("dims", obj.dims))
  if obj.weights is not None:
    object.__setattr__(obj, "weights", check_weights("weights", obj.weights, len(obj.dims)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _DistributedOptions:
  axis_name: Hashable


_TAU_DOC = """tau_plus: per-call override of the constructor's prior: a float, or a
        per-row ``[batch]`` array (inside ``shard_map``: this device's rows).
        Keyword-only here (memeff also takes it positionally).
      where: optional bool ``[batch]`` mask of the rows to keep (padding), as for
        the functions."""


# --- the four plain losses -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEfficientCLIPLoss(_Options):
  """memeff's ``MemoryEfficientCLIPLoss``: :func:`memeff_jax.clip_loss` (docs/math.md §4).

  Attributes:
    temperature: softmax temperature (a float; for a learnable one call the function
      with a traced array, or use ``memeff_jax.nnx.CLIPLoss``). Default 0.07.
    normalized_inputs, stable, tau_plus, label_smoothing, backend: as for
      :func:`memeff_jax.clip_loss`.
  """

  _function: ClassVar[str] = "clip_loss"

  def __call__(self, image_features: ArrayLike, text_features: ArrayLike, *,
               tau_plus: ArrayLike | None = None,
               where: ArrayLike | None = None) -> jax.Array:
    """The loss of image and text features: a float32 scalar.

    Args:
      image_features: [batch, d], the softmax rows.
      text_features: [batch, d], the softmax columns.
      {tau}
    """
    return self._call(image_features, text_features, tau_plus=tau_plus, where=where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEfficientLiTLoss(_Options):
  """memeff's ``MemoryEfficientLiTLoss``: :func:`memeff_jax.lit_loss` (docs/math.md §5).

  The first argument (text) is trained; the second (image) is locked and gets an
  exact zero gradient (memeff: ``None``).

  Attributes:
    temperature, normalized_inputs, stable, tau_plus, label_smoothing, backend: as for
      :func:`memeff_jax.lit_loss`.
  """

  _function: ClassVar[str] = "lit_loss"

  def __call__(self, text_features: ArrayLike, image_features: ArrayLike, *,
               tau_plus: ArrayLike | None = None,
               where: ArrayLike | None = None) -> jax.Array:
    """The loss of text (trained) and image (locked) features: a float32 scalar.

    Args:
      text_features: [batch, d], trained.
      image_features: [batch, d], locked.
      {tau}
    """
    return self._call(text_features, image_features, tau_plus=tau_plus, where=where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEfficientQwen3Loss(_Qwen3Options):
  """memeff's ``MemoryEfficientQwen3Loss``: :func:`memeff_jax.qwen3_loss` (docs/math.md §6).

  Attributes:
    temperature, margin, use_qq_negatives, use_dd_negatives, normalized_inputs, stable,
    tau_plus, label_smoothing, backend: as for :func:`memeff_jax.qwen3_loss`.
  """

  _function: ClassVar[str] = "qwen3_loss"

  def __call__(self, query_features: ArrayLike, doc_features: ArrayLike,
               hard_negatives: ArrayLike | None = None, *,
               tau_plus: ArrayLike | None = None,
               where: ArrayLike | None = None) -> jax.Array:
    """The loss of queries, documents and optional hard negatives: a float32 scalar.

    Args:
      query_features: [batch, d].
      doc_features: [batch, d]; document i is query i's positive.
      hard_negatives: optional [batch, k, d].
      {tau}
    """
    return self._call(query_features, doc_features, hard_negatives, tau_plus=tau_plus, where=where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEfficientLiTQwen3Loss(_LiTQwen3Options):
  """memeff's ``MemoryEfficientLiTQwen3Loss``: :func:`memeff_jax.lit_qwen3_loss`
  (docs/math.md §6).

  Only the queries are trained; documents and hard negatives are locked. No
  ``use_dd_negatives``.

  Attributes:
    temperature, margin, use_qq_negatives, normalized_inputs, stable, tau_plus,
    label_smoothing, backend: as for :func:`memeff_jax.lit_qwen3_loss`.
  """

  _function: ClassVar[str] = "lit_qwen3_loss"

  def __call__(self, query_features: ArrayLike, doc_features: ArrayLike,
               hard_negatives: ArrayLike | None = None, *,
               tau_plus: ArrayLike | None = None,
               where: ArrayLike | None = None) -> jax.Array:
    """The loss of queries (trained), documents and hard negatives (locked): a float32
    scalar.

    Args:
      query_features: [batch, d], trained.
      doc_features: [batch, d], locked.
      hard_negatives: optional [batch, k, d], locked.
      {tau}
    """
    return self._call(query_features, doc_features, hard_negatives, tau_plus=tau_plus, where=where)


for _cls in (MemoryEfficientCLIPLoss, MemoryEfficientLiTLoss, MemoryEfficientQwen3Loss,
             MemoryEfficientLiTQwen3Loss):
  _cls.__call__.__doc__ = _cls.__call__.__doc__.replace("{tau}", _TAU_DOC)


# --- fused Matryoshka ------------------------------------------------------------------------

_MRL_ATTRS = """
  How it runs is the function's default: on a GPU, one plain block per dim
  (``KernelConfig.matryoshka_per_dim``; 16-bit inputs, and fp32 up to a padded feature
  size of 256), else one block whose feature pass serves every dim. Same loss.

  Attributes:
    dims: strictly increasing prefix sizes, the last equal to the feature size (passed
      as ``matryoshka_dims``). memeff also needs multiples of 64; any sizes work here.
    weights: optional per-dim weights (``matryoshka_weights``; default 1 each, not
      normalized: the loss is the weighted sum).
    The other options: as for the plain class.
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEfficientMatryoshkaCLIPLoss(_MatryoshkaOptions, MemoryEfficientCLIPLoss):
  """memeff's fused ``MemoryEfficientMatryoshkaCLIPLoss``: :func:`memeff_jax.clip_loss`
  with ``matryoshka_dims=dims, matryoshka_weights=weights`` (docs/math.md §8.1).
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEfficientMatryoshkaLiTLoss(_MatryoshkaOptions, MemoryEfficientLiTLoss):
  """memeff's fused ``MemoryEfficientMatryoshkaLiTLoss``: :func:`memeff_jax.lit_loss`
  with ``matryoshka_dims=dims, matryoshka_weights=weights`` (docs/math.md §8.1).
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEfficientMatryoshkaQwen3Loss(_MatryoshkaOptions, MemoryEfficientQwen3Loss):
  """memeff's fused ``MemoryEfficientMatryoshkaQwen3Loss``: :func:`memeff_jax.qwen3_loss`
  with ``matryoshka_dims=dims, matryoshka_weights=weights`` (docs/math.md §8.1).
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEfficientMatryoshkaLiTQwen3Loss(_MatryoshkaOptions, MemoryEfficientLiTQwen3Loss):
  """memeff's fused ``MemoryEfficientMatryoshkaLiTQwen3Loss``:
  :func:`memeff_jax.lit_qwen3_loss` with ``matryoshka_dims=dims,
  matryoshka_weights=weights`` (docs/math.md §8.1).
  """


for _cls in (MemoryEfficientMatryoshkaCLIPLoss, MemoryEfficientMatryoshkaLiTLoss,
             MemoryEfficientMatryoshkaQwen3Loss, MemoryEfficientMatryoshkaLiTQwen3Loss):
  _cls.__doc__ += _MRL_ATTRS


# --- Distributed*: the same losses over a shard_map axis -------------------------------------

_DIST_ATTRS = """
  Call it inside ``jax.shard_map`` with this device's contiguous shard of every array
  (hard negatives and per-row ``tau_plus`` stay with their query). Unlike memeff's
  per-rank share, every device gets the **global** loss; gradients are the local
  rows of the global loss's gradient (docs/math.md §9). Holding global arrays
  instead? ``memeff_jax.sharded(<function>, mesh, axis_name)``.

  Attributes:
    axis_name: the mesh axis the batch is sharded over (memeff: the process group).
    The other options: as for the single-device class.
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedMemoryEfficientCLIPLoss(_DistributedOptions, MemoryEfficientCLIPLoss):
  """memeff's ``DistributedMemoryEfficientCLIPLoss``: :func:`memeff_jax.clip_loss`
  with ``axis_name=``.
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedMemoryEfficientLiTLoss(_DistributedOptions, MemoryEfficientLiTLoss):
  """memeff's ``DistributedMemoryEfficientLiTLoss``: :func:`memeff_jax.lit_loss` with
  ``axis_name=``.
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedMemoryEfficientQwen3Loss(_DistributedOptions, MemoryEfficientQwen3Loss):
  """memeff's ``DistributedMemoryEfficientQwen3Loss``: :func:`memeff_jax.qwen3_loss`
  with ``axis_name=``.
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedMemoryEfficientLiTQwen3Loss(_DistributedOptions,
                                             MemoryEfficientLiTQwen3Loss):
  """memeff's ``DistributedMemoryEfficientLiTQwen3Loss``:
  :func:`memeff_jax.lit_qwen3_loss` with ``axis_name=``.
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedMemoryEfficientMatryoshkaCLIPLoss(_DistributedOptions,
                                                   MemoryEfficientMatryoshkaCLIPLoss):
  """memeff's ``DistributedMemoryEfficientMatryoshkaCLIPLoss``:
  :func:`memeff_jax.clip_loss` with ``matryoshka_dims=``, ``matryoshka_weights=`` and
  ``axis_name=``.
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedMemoryEfficientMatryoshkaLiTLoss(_DistributedOptions,
                                                  MemoryEfficientMatryoshkaLiTLoss):
  """memeff's ``DistributedMemoryEfficientMatryoshkaLiTLoss``:
  :func:`memeff_jax.lit_loss` with ``matryoshka_dims=``, ``matryoshka_weights=`` and
  ``axis_name=``.
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedMemoryEfficientMatryoshkaQwen3Loss(_DistributedOptions,
                                                    MemoryEfficientMatryoshkaQwen3Loss):
  """memeff's ``DistributedMemoryEfficientMatryoshkaQwen3Loss``:
  :func:`memeff_jax.qwen3_loss` with ``matryoshka_dims=``, ``matryoshka_weights=`` and
  ``axis_name=``.
  """


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedMemoryEfficientMatryoshkaLiTQwen3Loss(
    _DistributedOptions, MemoryEfficientMatryoshkaLiTQwen3Loss):
  """memeff's ``DistributedMemoryEfficientMatryoshkaLiTQwen3Loss``:
  :func:`memeff_jax.lit_qwen3_loss` with ``matryoshka_dims=``,
  ``matryoshka_weights=`` and ``axis_name=``.
  """


for _cls in (DistributedMemoryEfficientCLIPLoss, DistributedMemoryEfficientLiTLoss,
             DistributedMemoryEfficientQwen3Loss, DistributedMemoryEfficientLiTQwen3Loss,
             DistributedMemoryEfficientMatryoshkaCLIPLoss,
             DistributedMemoryEfficientMatryoshkaLiTLoss,
             DistributedMemoryEfficientMatryoshkaQwen3Loss,
             DistributedMemoryEfficientMatryoshkaLiTQwen3Loss):
  _cls.__doc__ += _DIST_ATTRS


# --- the eager wrapper -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MatryoshkaLoss:
  """memeff's eager ``MatryoshkaLoss``: :func:`memeff_jax.matryoshka` (docs/math.md §8.3).

  ``MatryoshkaLoss(base_loss, dims, weights)(*arrays, **kwargs)`` is
  ``sum_k w_k * base_loss(*(a[..., :m_k] for a in arrays), **kwargs)``: every prefix
  is renormalized by the base loss, one full loss pass per dim. The slicing is
  :func:`memeff_jax.matryoshka`'s (feature arrays, ``hard_negatives`` too, never
  ``tau_plus``). The fused classes (or ``matryoshka_dims=``) give the same loss, per-dim
  statistics and every option applied per dim; on a GPU they too run one plain block
  per dim by default (``KernelConfig.matryoshka_per_dim``).

  Attributes:
    base_loss: any loss callable: a class of this module or a function such as
      ``functools.partial(memeff_jax.clip_loss, temperature=0.05)``. It must
      normalize its inputs (``normalized_inputs=True`` raises ValueError).
    dims: strictly increasing prefix sizes, ``dims[-1] <= d``.
    weights: optional per-dim weights (default 1 each, not normalized).

  Raises:
    ValueError, TypeError: as :func:`memeff_jax.matryoshka` raises them (a base loss
      with ``normalized_inputs=True``, bad dims or weights), at construction.
  """

  base_loss: Callable[..., jax.Array]
  dims: tuple[int, ...]
  weights: tuple[float, ...] | None = None

  def __post_init__(self):
    _checked_dims(self)
    # Checks the base loss (normalized_inputs=True raises, a field or a partial's keyword).
    memeff_jax.matryoshka(self.base_loss, self.dims, weights=self.weights)

  def __call__(self, *arrays: ArrayLike, **kwargs) -> jax.Array:
    """The weighted sum of ``base_loss`` over the prefixes: a float32 scalar."""
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

  temperature: float = 0.07
  normalized_inputs: bool = False
  backend: Backend = "auto"

  _function: ClassVar[str] = "clip_loss"
  _fixed: ClassVar[dict[str, Any]] = {"stable": True}

  def __post_init__(self):
    _warn_deprecated("StableMemoryEfficientCLIPLoss", "MemoryEfficientCLIPLoss")

  def __call__(self, image_features: ArrayLike, text_features: ArrayLike, *,
               tau_plus: ArrayLike | None = None,
               where: ArrayLike | None = None) -> jax.Array:
    """As :meth:`MemoryEfficientCLIPLoss.__call__`."""
    return self._call(image_features, text_features, tau_plus=tau_plus, where=where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StableMemoryEfficientLiTLoss(_Wrapper):
  """Deprecated memeff alias: :func:`memeff_jax.lit_loss` with ``stable=True``.

  Warns ``DeprecationWarning`` on construction. Takes only ``temperature``,
  ``normalized_inputs`` (and ``backend``); use :class:`MemoryEfficientLiTLoss`.
  """

  temperature: float = 0.07
  normalized_inputs: bool = False
  backend: Backend = "auto"

  _function: ClassVar[str] = "lit_loss"
  _fixed: ClassVar[dict[str, Any]] = {"stable": True}

  def __post_init__(self):
    _warn_deprecated("StableMemoryEfficientLiTLoss", "MemoryEfficientLiTLoss")

  def __call__(self, text_features: ArrayLike, image_features: ArrayLike, *,
               tau_plus: ArrayLike | None = None,
               where: ArrayLike | None = None) -> jax.Array:
    """As :meth:`MemoryEfficientLiTLoss.__call__`."""
    return self._call(text_features, image_features, tau_plus=tau_plus, where=where)
