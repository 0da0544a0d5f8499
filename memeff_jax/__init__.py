"""memeff_jax: memory-efficient contrastive losses for JAX."""

from memeff_jax import reference
from memeff_jax._terms import ContrastiveStats
from memeff_jax._terms import SigLIPStats
from memeff_jax._checkify import checkify_checks
from memeff_jax._version import __version__
from memeff_jax.clip import clip_loss
from memeff_jax.clip import clip_loss_with_stats
from memeff_jax.config import KernelConfig
from memeff_jax.config import default_config
from memeff_jax.grad_caching import grad_cache
from memeff_jax.lit import lit_loss
from memeff_jax.lit import lit_loss_with_stats
from memeff_jax.matryoshka import matryoshka
from memeff_jax.qwen3 import lit_qwen3_loss
from memeff_jax.qwen3 import lit_qwen3_loss_with_stats
from memeff_jax.qwen3 import qwen3_loss
from memeff_jax.qwen3 import qwen3_loss_with_stats
from memeff_jax.sharding import sharded
from memeff_jax.siglip import siglip_loss
from memeff_jax.siglip import siglip_loss_with_stats

__all__ = [
    "ContrastiveStats",
    "KernelConfig",
    "SigLIPStats",
    "__version__",
    "checkify_checks",
    "clip_loss",
    "clip_loss_with_stats",
    "default_config",
    "grad_cache",
    "lit_loss",
    "lit_loss_with_stats",
    "lit_qwen3_loss",
    "lit_qwen3_loss_with_stats",
    "matryoshka",
    "qwen3_loss",
    "qwen3_loss_with_stats",
    "reference",
    "sharded",
    "siglip_loss",
    "siglip_loss_with_stats",
]
