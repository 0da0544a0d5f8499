"""Kernel configuration: ``KernelConfig`` and its groups (``kernel``), the default
table (``defaults``), the shared-memory model and fitting to smaller GPUs (``smem``),
and Matryoshka retiling (``matryoshka``)."""

from memeff_jax.config.defaults import default_config
from memeff_jax.config.kernel import Algorithm
from memeff_jax.config.kernel import BlockwiseOptions
from memeff_jax.config.kernel import Budgets
from memeff_jax.config.kernel import BwdTiles
from memeff_jax.config.kernel import FwdTiles
from memeff_jax.config.kernel import KernelConfig
from memeff_jax.config.kernel import Precision
from memeff_jax.config.kernel import RoleTiles
from memeff_jax.config.matryoshka import ladder_chunk
from memeff_jax.config.matryoshka import matryoshka_config
from memeff_jax.config.smem import fit_smem
from memeff_jax.config.smem import paired_config
from memeff_jax.config.smem import smem_bytes

__all__ = ["Algorithm", "BlockwiseOptions", "Budgets", "BwdTiles", "FwdTiles",
           "KernelConfig", "Precision", "RoleTiles", "default_config", "fit_smem",
           "ladder_chunk", "matryoshka_config", "paired_config", "smem_bytes"]
