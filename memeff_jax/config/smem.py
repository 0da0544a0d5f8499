"""The kernels' shared-memory model, and fitting a config to GPUs with less shared
memory than the H100/H200 the default table was measured on."""

from __future__ import annotations

from memeff_jax.config.kernel import ROLES, KernelConfig, RoleTiles, is_int


def pow2(v: int) -> int:
  return max(16, 1 << (int(v) - 1).bit_length())


# Compute capability majors of the data-center Blackwell GPUs (B200, B300: tcgen05), on
# which Triton's 16-bit FlashAttention-shaped gradient holds one more [block_n, d_pad]
# tile than on sm_90 when its rows are resident. Compiled for sm_100 without a GPU
# (Triton 3.6.0 and 3.9.0 alike; tests/test_config.py's compile test): 64 x 64 tiles,
# 2 stages, d = 512, bfloat16 take 262,688 bytes there against 205,312 for sm_90 (the
# estimate below: 196,608, and 262,144 with that tile), so the H200's tile does not fit
# a B200's 227 KiB. The tiled kernels and the chunked Matryoshka gradient take what they
# take for sm_90; the float32 gradient varies (the extra tile at d_pad = 256 on 64 x 32
# tiles, none at 64, 128 and 512), and each float32 default fits with it (at most 192 KiB
# compiled), so the estimate counts it for 16-bit inputs alone.
TCGEN05_ARCHS = (10, 11)
# The FlashAttention-shaped gradient's kinds of pass: (rows' softmax, columns').
PASSES = ((True, True), *ROLES)
# The switch to the tiled forward, both sides from each tile (``Algorithm.fwd_col_pass``
# would make a two-sided block two one-sided passes; the sweep's rows keep it set).
TILED_FORWARD = dict(fwd_tiled=True, fwd_col_pass=False)


def check_arch(arch) -> None:
  """``arch`` as the fitting functions take it: None (sm_90) or a compute capability's
  major version (an int >= 1). A string or float would match no tuple of majors and
  fit silently as sm_90."""
  if arch is None:
    return
  if not is_int(arch):
    raise TypeError(f"arch must be None or an int (a compute capability's major version, "
                    f"9 for an H100), got arch={arch!r}")
  if arch < 1:
    raise ValueError(f"arch must be >= 1 (a compute capability's major version), got "
                     f"arch={arch}")


def check_smem_kib(smem_kib) -> None:
  """``smem_kib`` as the fitting functions take it: None (the H100's 227 KiB) or the KiB
  of shared memory one block may use, an int above the 8 KiB kept for Triton's scratch."""
  if smem_kib is None:
    return
  if not is_int(smem_kib):
    raise TypeError(f"smem_kib must be None or an int (KiB of shared memory a block, 227 "
                    f"for an H100), got smem_kib={smem_kib!r}")
  if smem_kib <= 8:
    raise ValueError(f"smem_kib must be > 8 (KiB of shared memory a block; 8 are kept for "
                     f"Triton's scratch), got smem_kib={smem_kib}")


def smem_bytes(cfg: KernelConfig, d: int, itemsize: int, passes=PASSES,
               arch: int | None = None) -> tuple[int, int]:
  """Estimated shared memory of the (forward, gradient) kernels ``cfg`` launches for
  feature size ``d``: the pipelined tiles, as Triton 3.6 allocates them on an H200
  (a resident row tile plus ``stages`` streamed tiles, or ``stages`` chunk pairs).
  The FlashAttention-shaped gradient's: the largest of its ``passes``, each on its
  tiles (``BwdTiles.for_pass``), and on a GPU of compute capability major ``arch`` in
  ``TCGEN05_ARCHS`` a 16-bit one with resident rows holds one more column tile.
  Raises TypeError / ValueError for an ``arch`` that is not None or an int >= 1."""
  check_arch(arch)
  d_pad = pow2(d)
  extra = lambda bn, bd: (bn * d_pad * itemsize if arch in TCGEN05_ARCHS and itemsize < 4
                          and bd >= d_pad else 0)

  def chunks(bm, bn, bk, st):   # GEMM tiles: the features walked in chunks
    return (bm + bn) * min(bk, d_pad) * itemsize * st

  def sweep(bm, bn, bd, st):   # a resident row tile, or chunks if bd < d
    return (bm + st * bn) * d_pad * itemsize if bd >= d_pad else chunks(bm, bn, bd, st)

  def gradient(bw):
    b = (bw.block_m, bw.block_n, bw.block_d, bw.num_stages)
    if alg.bwd_tiled:
      return chunks(*b)
    # plus the streamed gradient-feature tiles when they are not the similarity's
    return sweep(*b) + extra(bw.block_n, bw.block_d) + (
        0 if min(bw.block_d, bw.block_do) >= d_pad else
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
  less 8 KiB kept free for Triton's scratch (``check_smem_kib``'s errors otherwise)."""
  check_smem_kib(smem_kib)
  return ((227 if smem_kib is None else smem_kib) - 8) * 2**10


def fewer_stages(cfg: KernelConfig, need, limit: int) -> KernelConfig:
  """``cfg`` with its FlashAttention-shaped gradient's pipeline stages dropped, down
  to 2, until ``need(cfg)`` (its shared memory, bytes) is at most ``limit``."""
  while need(cfg) > limit and cfg.bwd.num_stages > 2:
    cfg = cfg.evolve(bwd=dict(num_stages=cfg.bwd.num_stages - 1))
  return cfg


def fit_smem(cfg: KernelConfig, d: int, itemsize: int, smem_kib: int | None,
             arch: int | None = None) -> KernelConfig:
  """``cfg``, fitted where a launch would exceed ``smem_kib`` (None: the H100's 227 KiB;
  8 KiB kept free for Triton's scratch) on a GPU of compute capability major ``arch`` (None: as sm_90): a
  FlashAttention-shaped gradient first drops the role tiles (``BwdTiles.row_role`` /
  ``col_role``) that do not fit, then pipeline stages (down to 2), then the forward
  and/or gradient switch to the tiled kernels (whose chunked tiles need far less shared
  memory). An H100/H200 (227 KiB) never needs it; an A100 (163 KiB), a consumer GPU
  (99 KiB) or a B200 (227 KiB, ``TCGEN05_ARCHS``: the 16-bit gradient at d_pad = 512)
  can (the 16-bit gradient at d_pad = 128 keeps its tile on a 99 KiB GPU with 2
  stages). Not measured on those GPUs: compiled for them (tests/test_config.py).
  Raises TypeError / ValueError for a ``smem_kib`` or ``arch`` that no GPU has
  (``check_smem_kib``, ``check_arch``)."""
  limit = smem_limit(smem_kib)
  need = lambda c, passes=PASSES: smem_bytes(c, d, itemsize, passes, arch)
  if not cfg.algorithm.bwd_tiled:
    for kind, role in ROLES.items():
      if need(cfg, (kind,))[1] > limit:
        cfg = cfg.evolve(bwd={role: RoleTiles()})
    cfg = fewer_stages(cfg, lambda c: need(c)[1], limit)
  fwd, bwd = need(cfg)
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
