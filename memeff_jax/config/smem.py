"""The kernels' shared-memory model, and fitting a config to GPUs with less shared
memory than the H100/H200 the default table was measured on."""

from __future__ import annotations

from memeff_jax.config.kernel import ROLES, KernelConfig, RoleTiles


def pow2(v: int) -> int:
  return max(16, 1 << (int(v) - 1).bit_length())


# The FlashAttention-shaped gradient's kinds of pass: (rows' softmax, columns').
PASSES = ((True, True), *ROLES)
# The switch to the tiled forward, both sides from each tile (``Algorithm.fwd_col_pass``
# would make a two-sided block two one-sided passes; the sweep's rows keep it set).
TILED_FORWARD = dict(fwd_tiled=True, fwd_col_pass=False)


def smem_bytes(cfg: KernelConfig, d: int, itemsize: int,
               passes=PASSES) -> tuple[int, int]:
  """Estimated shared memory of the (forward, gradient) kernels ``cfg`` launches for
  feature size ``d``: the pipelined tiles, as Triton 3.6 allocates them on an H200
  (a resident row tile plus ``stages`` streamed tiles, or ``stages`` chunk pairs).
  The FlashAttention-shaped gradient's: the largest of its ``passes``, each on its
  tiles (``BwdTiles.for_pass``)."""
  d_pad = pow2(d)

  def chunks(bm, bn, bk, st):   # GEMM tiles: the features walked in chunks
    return (bm + bn) * min(bk, d_pad) * itemsize * st

  def sweep(bm, bn, bd, st):   # a resident row tile, or chunks if bd < d
    return (bm + st * bn) * d_pad * itemsize if bd >= d_pad else chunks(bm, bn, bd, st)

  def gradient(bw):
    b = (bw.block_m, bw.block_n, bw.block_d, bw.num_stages)
    if alg.bwd_tiled:
      return chunks(*b)
    # plus the streamed gradient-feature tiles when they are not the similarity's
    return sweep(*b) + (0 if min(bw.block_d, bw.block_do) >= d_pad else
                        bw.block_n * min(bw.block_do, d_pad) * itemsize * b[3])

  fw, alg = cfg.fwd, cfg.algorithm
  f = (fw.block_m, fw.block_n, fw.block_d, fw.num_stages)
  fwd = chunks(*f) if alg.fwd_tiled else sweep(*f)
  if alg.bwd_tiled:   # (no role tiles)
    return fwd, gradient(cfg.bwd)
  return fwd, max(gradient(cfg.bwd.for_pass(*p)) for p in passes)


def tiled(cfg: KernelConfig, pass_: str, bk: int, d: int, itemsize: int,
          limit: int) -> KernelConfig:
  """``cfg`` with its forward (pass_="fwd") or gradient ("bwd") switched to the tiled
  kernel with the H200's tiled tiles and ``bk``-feature chunks, with the most
  pipeline stages whose shared memory for feature size d fits ``limit`` bytes."""
  tiles = (dict(block_m=128, block_n=128, block_d=bk, num_warps=8) if pass_ == "fwd" else
           dict(block_m=64, block_n=128, block_d=bk, num_warps=4))
  switch = TILED_FORWARD if pass_ == "fwd" else dict(bwd_tiled=True)
  for st in ((3, 2) if pass_ == "fwd" else (4, 3, 2)):
    cfg = cfg.evolve(**{pass_: dict(tiles, num_stages=st)}, algorithm=switch)
    if smem_bytes(cfg, d, itemsize)[pass_ == "bwd"] <= limit:
      break
  return cfg


def smem_limit(smem_kib: int | None) -> int:
  """Bytes of shared memory a launch may use: ``smem_kib`` (None: the H100's 227 KiB)
  less 8 KiB kept free for Triton's scratch."""
  return ((227 if smem_kib is None else smem_kib) - 8) * 2**10


def fewer_stages(cfg: KernelConfig, need, limit: int) -> KernelConfig:
  """``cfg`` with its FlashAttention-shaped gradient's pipeline stages dropped, down
  to 2, until ``need(cfg)`` (its shared memory, bytes) is at most ``limit``."""
  while need(cfg) > limit and cfg.bwd.num_stages > 2:
    cfg = cfg.evolve(bwd=dict(num_stages=cfg.bwd.num_stages - 1))
  return cfg


def fit_smem(cfg: KernelConfig, d: int, itemsize: int, smem_kib: int) -> KernelConfig:
  """``cfg``, fitted where a launch would exceed ``smem_kib`` (8 KiB kept free for
  Triton's scratch): a FlashAttention-shaped gradient first drops the role tiles
  (``BwdTiles.row_role`` / ``col_role``) that do not fit, then pipeline stages (down
  to 2), then the forward and/or gradient switch to the tiled kernels (whose chunked
  tiles need far less shared memory). An H100/H200 (227 KiB) never needs it; an A100
  (163 KiB) or a consumer GPU (99 KiB) can (the 16-bit gradient at d_pad = 128 keeps
  its tile there with 2 stages). Not measured on those GPUs."""
  limit = smem_limit(smem_kib)
  if not cfg.algorithm.bwd_tiled:
    for kind, role in ROLES.items():
      if smem_bytes(cfg, d, itemsize, passes=(kind,))[1] > limit:
        cfg = cfg.evolve(bwd={role: RoleTiles()})
    cfg = fewer_stages(cfg, lambda c: smem_bytes(c, d, itemsize)[1], limit)
  fwd, bwd = smem_bytes(cfg, d, itemsize)
  bk = 64 if itemsize < 4 else 32
  if fwd > limit:
    cfg = tiled(cfg, "fwd", bk, d, itemsize, limit)
  if bwd > limit:
    cfg = tiled(cfg, "bwd", bk, d, itemsize, limit)
  return cfg


def paired_config(cfg: KernelConfig, d: int, itemsize: int,
                  smem_kib: int | None = None) -> KernelConfig:
  """The config of a ``bwd_pair`` gradient: ``cfg`` where its gradient is tiled, else
  with the tiled gradient's tiles (as ``fit_smem`` picks them) in place of the
  FlashAttention-shaped ones, on cfg's feature chunk (at most 64, 32 for fp32)."""
  if cfg.algorithm.bwd_tiled:
    return cfg
  chunk = min(cfg.bwd.block_d, 64 if itemsize < 4 else 32)
  return tiled(cfg, "bwd", chunk, d, itemsize, smem_limit(smem_kib))
