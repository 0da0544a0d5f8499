"""Backends: the ``Backend`` Protocol, the registry of names, and ``resolve``.

``blockwise`` (pure JAX), ``reference`` (dense) and ``triton`` (the kernels; imported
only when resolved). See ``registry`` for the names and ``base`` for the contract.
"""

from memeff_jax.backends.base import Backend
from memeff_jax.backends.base import Block
from memeff_jax.backends.base import DenseBackend
from memeff_jax.backends.registry import NAMES
from memeff_jax.backends.registry import BackendName
from memeff_jax.backends.registry import resolve

__all__ = ["NAMES", "Backend", "BackendName", "Block", "DenseBackend", "resolve"]
