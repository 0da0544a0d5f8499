"""Dense float64 JAX reference of sentence-transformers' MultipleNegativesRankingLoss.

Written from the definitions of sentence-transformers 6.3.0
(``sentence_transformer/losses/multiple_negatives_ranking.py``, ``compute_loss_from_embeddings``
with the default ``similarity_fct=cos_sim`` and ``hardness_mode=None``), independent of
memeff_jax's code; checked against the library (torch float64) to a relative error below 1e-12
in value and gradients. Uses only jax; the caller enables ``jax_enable_x64``.

Definitions. Inputs are the columns ST receives, ``[anchor, positive, neg_1, ..., neg_n]``, each
``[B, D]``; ``q_i``, ``d_i``, ``h_i^k`` are their rows divided by ``max(||.||, 1e-12)``
(``torch.nn.functional.normalize``), ``c(u, v) = u . v``, ``s = scale``. The documents are
``D = [d_1..d_B, h_1^1..h_B^1, ..., h_1^n..h_B^n]`` (B (1 + n) columns, positives first). Row i
(one per anchor) has up to four logit groups:

  query_to_doc   s c(q_i, D_j), all B (1 + n) columns, none masked (positive at j = i).
  query_to_query s c(q_i, q_j), B columns, j = i masked (-inf).
  doc_to_query   s c(d_i, q_j), B columns, none masked (j = i is the positive pair again).
  doc_to_doc     s c(d_i, D_j), B (1 + n) columns, masked where D_j belongs to query i
                 (d_i itself and h_i^1..h_i^n); other rows' hard negatives stay.

Hard negatives enter only query_to_doc and doc_to_doc (as columns); doc_to_query and
query_to_query never see them, and they are never rows. With ``p_i = s c(q_i, d_i)`` and
``G`` the selected groups (repeats in ``directions`` count once):

  joint:          loss = mean_i [ logsumexp(concat_{g in G} row_i^g) - p_i ]
  per_direction:  loss = mean_i [ (1 / |G|) sum_{g in G} logsumexp(row_i^g) - p_i ]
                       = (1 / |G|) sum_g (cross-entropy of direction g, positive p_i)

In joint mode with doc_to_query, ``p_i`` is in the denominator twice (once per group).
ST raises ValueError (same order, same messages as here) for scale <= 0, empty ``directions``,
an unknown direction, ``directions`` without "query_to_doc", a ``partition_mode`` other than
"joint" / "per_direction", and "per_direction" with "query_to_query" or "doc_to_doc". So
per_direction admits only ("query_to_doc",) and ("query_to_doc", "doc_to_query").

GTE. 6.3.0 has no separate GTE / bidirectional class: GTE's improved contrastive loss (Li et
al. 2023, arXiv 2308.03281) is ``mnrl(q, d, directions=("query_to_doc", "query_to_query",
"doc_to_query", "doc_to_doc"), partition_mode="joint")`` (``scale`` = 1 / tau), whose
denominator is GTE's Z_i: sum_j e^{s(q_i,d_j)} + sum_{j!=i} e^{s(q_i,q_j)} + sum_j e^{s(q_j,d_i)}
+ sum_{j!=i} e^{s(d_j,d_i)}; ST extends it with hard negatives as above. The deprecated
``MultipleNegativesSymmetricRankingLoss`` (and its Cached variant) is ``directions=
("query_to_doc", "doc_to_query"), partition_mode="per_direction"``.

``gather_across_devices=True`` (W ranks of B rows each): every rank's rows are its own anchors,
its columns the gathered anchors / documents of all ranks (documents ordered [all positives,
all neg_1, ...]); each rank averages over its B rows, the gather's backward sums gradients
across ranks and DDP averages them, so training follows ``mnrl`` on the concatenated global
batch of W B rows (the mean of the ranks' losses equals it).
"""

import jax.numpy as jnp
from jax.scipy.special import logsumexp

DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
GTE_DIRECTIONS = DIRECTIONS


def _check(scale, directions, partition_mode):
  """Raises ValueError where ST's constructor does, in its order and with its messages.

  Args:
    scale: the logit scale.
    directions: the selected directions.
    partition_mode: "joint" or "per_direction".

  Raises:
    ValueError: for any combination ST rejects.
  """
  valid = set(DIRECTIONS)
  if not scale > 0:
    raise ValueError("Scale must be a positive value.")
  if not directions:
    raise ValueError("At least one direction must be specified.")
  if not set(directions).issubset(valid):
    raise ValueError(f"Invalid directions: {set(directions) - valid}. Valid: {valid}")
  if "query_to_doc" not in directions:
    raise ValueError("'query_to_doc' direction is required (contains the positive pair).")
  if partition_mode not in ("joint", "per_direction"):
    raise ValueError(f"partition_mode must be 'joint' or 'per_direction', got {partition_mode}")
  if partition_mode == "per_direction" and set(directions) & {"query_to_query", "doc_to_doc"}:
    raise ValueError(
        "partition_mode='per_direction' requires every direction's candidate pool to include the "
        "positive pair. 'query_to_query' and 'doc_to_doc' only contain same-type similarities and "
        "never include the positive, making the per-direction loss ill-defined. Use "
        "partition_mode='joint' instead.")


def _unit(x):
  """Rows divided by max(norm, 1e-12), as torch.nn.functional.normalize (ST's cos_sim)."""
  x = jnp.asarray(x)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def mnrl(anchors, positives, negatives=(), *, scale=20.0, directions=("query_to_doc",),
         partition_mode="joint"):
  """sentence-transformers' MultipleNegativesRankingLoss (cosine similarity), dense.

  Args:
    anchors: ``[B, D]``, the queries (ST's first column).
    positives: ``[B, D]``, row i the positive of anchor i (second column).
    negatives: a sequence of n arrays ``[B, D]``, the k-th holding row i's k-th hard negative
      (columns 3..n+2).
    scale: the logit scale (1 / temperature), > 0.
    directions: a non-empty subset of ``DIRECTIONS`` containing "query_to_doc"; order and
      repeats do not matter.
    partition_mode: "joint" (one softmax over all groups) or "per_direction" (one per group,
      the log-partitions averaged).

  Returns:
    The scalar loss, the mean over the B anchors.

  Raises:
    ValueError: for the combinations ST rejects (see the module docstring).
  """
  _check(scale, directions, partition_mode)
  groups = tuple(dict.fromkeys(directions))   # ST keys its logit groups by name
  q, d = _unit(anchors), _unit(positives)
  docs = jnp.concatenate([d] + [_unit(h) for h in negatives], axis=0)   # [B (1 + n), D]
  b = q.shape[0]
  rows = jnp.arange(b)[:, None]
  self_col = rows == jnp.arange(b)[None, :]                   # [B, B]: column j == i
  own_doc = rows == jnp.arange(docs.shape[0])[None, :] % b    # [B, B (1 + n)]: D_j of query i

  logits = {}
  # query -> every document: in-batch positives and all hard negatives, nothing masked.
  logits["query_to_doc"] = scale * (q @ docs.T)
  if "query_to_query" in groups:
    # query -> the other queries: the anchor itself is masked.
    logits["query_to_query"] = jnp.where(self_col, -jnp.inf, scale * (q @ q.T))
  if "doc_to_query" in groups:
    # positive d_i -> every query, q_i included (the positive pair); no hard negatives.
    logits["doc_to_query"] = scale * (d @ q.T)
  if "doc_to_doc" in groups:
    # positive d_i -> every document except those of query i (d_i itself, h_i^1..h_i^n).
    logits["doc_to_doc"] = jnp.where(own_doc, -jnp.inf, scale * (d @ docs.T))

  positive = scale * jnp.sum(q * d, axis=-1)
  if partition_mode == "joint":
    log_z = logsumexp(jnp.concatenate([logits[g] for g in groups], axis=1), axis=1)
  else:
    # per_direction: each group's log-partition, averaged over the groups; the positive is
    # in every group (only query_to_doc and doc_to_query are allowed), so this is the mean
    # of the groups' cross-entropies.
    log_z = sum(logsumexp(logits[g], axis=1) for g in groups) / len(groups)
  return jnp.mean(log_z - positive)


def gte(anchors, positives, negatives=(), *, scale=20.0):
  """GTE's improved contrastive loss as ST expresses it: all four directions, joint.

  Args:
    anchors: ``[B, D]`` queries.
    positives: ``[B, D]`` documents.
    negatives: a sequence of ``[B, D]`` hard negatives (ST's extension; GTE has none).
    scale: 1 / tau.

  Returns:
    The scalar loss.
  """
  return mnrl(anchors, positives, negatives, scale=scale, directions=GTE_DIRECTIONS,
              partition_mode="joint")
