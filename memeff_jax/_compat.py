"""Version shims: JAX's varying-axis casts and standard numpy promotion, jax-triton's
import and triton_call, its TMA descriptors, its launch width for warp-specialized
kernels, its compile of Gluon kernels, a cache of compiled kernels across processes, and
a trace-time check of a kernel's shared memory against the GPU's."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import inspect
import json
import os
import pathlib
import re
import sys
import warnings
import zlib
from typing import Any

import jax
from jax import lax


def to_varying(v, axis_name):
  """Mark values (a pytree) as varying over ``axis_name`` (a name or a tuple of them),
  over the axes each does not vary over yet."""
  names = () if axis_name is None else (
      tuple(axis_name) if isinstance(axis_name, tuple) else (axis_name,))

  def one(a):
    missing = tuple(n for n in names if n not in varying_axes(a))
    if not missing:
      return a
    if hasattr(lax, "pcast"):
      return lax.pcast(a, missing, to="varying")
    return lax.pvary(a, missing)  # jax < 0.8
  return jax.tree.map(one, v)


def vary_like(v, *refs):
  """``v`` made varying over every manual axis any of ``refs`` varies over (so a
  fresh loop carry matches the values the loop body produces)."""
  axes = set()
  for r in jax.tree.leaves(refs):
    axes |= varying_axes(r)
  for axis in sorted(axes, key=str):
    v = to_varying(v, axis)
  return v


def standard_numpy(fn):
  """``fn`` traced under JAX's standard dtype and rank promotion, whatever the caller's
  ``jax_numpy_dtype_promotion`` ("strict") or ``jax_numpy_rank_promotion`` ("raise")
  say: the library's arithmetic (16-bit features against fp32 statistics, per-row
  values against [K, n] blocks) is written for them, and a user's setting is for the
  user's code. The entry points that trace it take this: the public losses
  (``_chain.run``), the dense reference's, and ``_core``'s custom VJP rules (its
  backward is traced later, in the caller's context). The small custom VJPs of
  ``_terms`` and ``_wrappers`` promote nothing and go without."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
      return fn(*args, **kwargs)
  return wrapped


def varying_axes(v) -> frozenset:
  """The manual mesh axes over which ``v`` differs between devices."""
  aval = jax.typeof(v)
  mat = getattr(aval, "manual_axis_type", None)
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", ()))


def on_context_mesh(outs):
  """Launch outputs (built from shapes alone, so on no mesh, as ``jax.pure_callback``'s
  and jax-triton's are) placed on the context's mesh, replicated, as an array that jnp
  makes there is: under ``jax.set_mesh`` with Explicit axes, jnp refuses to mix the two
  (a loop carry updated with a slab's results)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return outs
  return [jax.sharding.reshard(v, jax.sharding.PartitionSpec())
          if jax.typeof(v).sharding.mesh.empty else v for v in outs]


def jax_triton():
  """``jax_triton``, its first import leaving TRITON_CACHE_DIR as it was: jax-triton
  0.3.1 sets it to "" as it is imported (Triton's cache manager, which ``triton.compile``
  uses, then raises "Could not create or locate cache dir") and 0.4.1 deletes it (so
  Triton's cache moves to ~/.triton/cache). Neither reads it again: jax-triton compiles
  through Triton's stages, not through its cache. (Imported with ``import`` each time,
  so a thread that finds another's import under way waits for it.)"""
  first, before = "jax_triton" not in sys.modules, os.environ.get("TRITON_CACHE_DIR")
  try:
    import jax_triton as jt  # pylint: disable=g-import-not-at-top
  finally:
    if first and before is None:
      os.environ.pop("TRITON_CACHE_DIR", None)
    elif first:
      os.environ["TRITON_CACHE_DIR"] = before
  if first:
    warn_slow_pair(getattr(jt, "__version__", None))
  return jt


def _version(text: str) -> tuple[int, ...]:
  """A version string's major and minor numbers ("3.10.1+git0a1b" -> (3, 10))."""
  return tuple(int(v) for v in re.findall(r"\d+", text)[:2])


def warn_slow_pair(jax_triton_version: str | None) -> None:
  """Warn where jax-triton 0.3.x runs on Triton >= 3.7: the ``gpu`` extra allows both
  versions of each (the resolver picks 0.4.1 + 3.9 on its own; pinning jax-triton
  0.3.1 alone gets Triton 3.9). Every GPU test has run on 0.3.1 + 3.9 too (one H100,
  2026-12-06; gpu_tests_ledger.csv), but the Triton kernels, tuned on 3.6 and without
  the Gluon and TMA kernels that need jax-triton 0.4, are slower there at D = 512 (one
  H100, B = 65536, bf16: CLIP 51.1 against 49.0 ms, LiT 22.5 against 19.9, Qwen3 45.0
  against 42.7; h100_jt031_triton39.csv against h100_jt031_triton36.csv): Triton 3.9
  moves each of the resident tile's wgmma descriptors into uniform registers before its
  wgmma, +6-21% instructions a tile, which no tile choice avoids
  (h100_jt031_triton39_tiles.csv; benchmarks/NOTES.md)."""
  import triton  # pylint: disable=g-import-not-at-top
  if jax_triton_version and (_version(jax_triton_version) < (0, 4)
                             and _version(triton.__version__) >= (3, 7)):
    warnings.warn(
        f"jax-triton {jax_triton_version} with Triton {triton.__version__}: memeff_jax's "
        f"D = 512 losses run 4-13% slower than on Triton 3.6 (the Gluon and TMA kernels "
        f"that make Triton 3.9 fast need jax-triton 0.4): pip install 'triton==3.6.*', or "
        f"jax-triton 0.4.1 (Python >= 3.12)",
        RuntimeWarning, stacklevel=3)


# FMA contraction, on in every build the tests and benchmarks ran: jax-triton 0.3.x passes
# it on by default; 0.4 leaves it to Triton, whose default warns in 3.9 and turns it off
# from 3.10 (TRITON_DEFAULT_FP_FUSION). Pinned, as the compile-only tests pin it.
FP_FUSION = True


@functools.cache
def _triton_call_kwargs() -> tuple[str, dict]:
  """jax-triton's name for the output shapes (``out_shape`` in 0.3.x, ``out_type`` in
  0.4) and its keywords pinning ``FP_FUSION`` (0.4: through ``backend_options``)."""
  jt = jax_triton()
  params = inspect.signature(jt.triton_call).parameters
  out = "out_type" if "out_type" in params else "out_shape"
  if "backend_options" in params:
    return out, dict(backend_options={"enable_fp_fusion": FP_FUSION})
  return out, dict(enable_fp_fusion=FP_FUSION)


@dataclasses.dataclass(frozen=True)
class Tiles:
  """A kernel argument: the row-major [n, d] array ``base`` read through a TMA tensor
  descriptor in blocks of ``block`` = (rows, features); ``gluon``: the descriptor carries
  the NVMMA shared layout a Gluon kernel's shared buffers take."""

  base: Any
  block: tuple[int, int]
  gluon: bool = False

  def descriptor(self):
    jt = jax_triton()
    if not self.gluon:
      return jt.TensorDescriptor.from_array(self.base, self.block)
    from triton.experimental.gluon import language as gl  # pylint: disable=g-import-not-at-top
    dtype = {"bfloat16": gl.bfloat16, "float16": gl.float16}[str(self.base.dtype)]
    return jt.TensorDescriptor.from_array(
        self.base, self.block,
        layout=gl.NVMMASharedLayout.get_default_for(list(self.block), dtype))


def arrays(args) -> list:
  """The arrays behind a launch's arguments: a ``Tiles``'s base, ints left out."""
  return [a.base if isinstance(a, Tiles) else a for a in args if not isinstance(a, int)]


def compute_capability() -> tuple[int, int] | None:
  """The first device's compute capability (major, minor); None where it has none (a
  CPU)."""
  try:
    major, minor = (int(v) for v in str(jax.devices()[0].compute_capability).split("."))
  except (AttributeError, RuntimeError, ValueError):
    return None
  return major, minor


@functools.cache
def tma_descriptors(interpret: bool) -> bool:
  """Whether ``Tiles`` arguments can be launched: under Triton's interpreter, or on a
  GPU of compute capability >= 9.0 with jax-triton >= 0.4 (host-side descriptors,
  ``jax_triton.TensorDescriptor``; 0.3.x has none)."""
  try:
    if interpret:
      import triton.tools.tensor_descriptor  # pylint: disable=g-import-not-at-top,unused-import
      return True
    jt = jax_triton()
  except (ImportError, AttributeError, RuntimeError, ValueError):
    return False
  cc = compute_capability()
  return hasattr(jt, "TensorDescriptor") and cc is not None and cc[0] >= 9


@functools.cache
def gluon_kernels(interpret: bool) -> bool:
  """Whether the Gluon Hopper kernels can be launched: never under the interpreter; on a
  GPU of compute capability 9.x (wgmma, Hopper's alone) with TMA descriptors, Triton
  >= 3.9 (the Gluon language they are written in) and a jax-triton whose Gluon compile
  ``_compile_hook`` can route."""
  if interpret or not tma_descriptors(False):
    return False
  try:
    import triton.experimental.gluon.language.nvidia.hopper  # pylint: disable=g-import-not-at-top
    triton_lib = jax_triton().triton_lib
  except (ImportError, AttributeError, RuntimeError, ValueError):
    return False
  cc = compute_capability()
  return (cc is not None and cc[0] == 9 and _version(triton.__version__) >= (3, 9)
          and hasattr(triton_lib, "compile_ttir_inplace")
          and hasattr(triton_lib, "CompilationResult"))


def gluon_ptx(module, backend, options, arch) -> dict:
  """A module built by ``(Gluon)ASTSource.make_ir`` lowered to PTX as jax-triton 0.4's
  ``compile_ttir_inplace`` does, except that a Gluon module (its ``ttg.num-warps`` is set
  at make_ir) goes through the backend's ``gluon_to_ttgir``, as ``triton.compile`` does:
  jax-triton runs Triton's ``make_ttir`` + ``make_ttgir`` on it, which rewrites the
  hand-written kernel (a full wgmma wait after every wgmma, compiled for sm_90: 9 where
  it has 1). Returns the PTX, the TTGIR and LLVM IR texts and the metadata."""
  md = {}
  if module.get_int_attr("ttg.num-warps") is not None:
    ttgir = backend.gluon_to_ttgir(module, md, options, arch)
  else:
    ttgir = backend.make_ttgir(backend.make_ttir(module, md, options, arch), md, options, arch)
  ttgir_text = str(ttgir)   # make_llir lowers the module in place
  llir = backend.make_llir(ttgir, md, options, arch)
  ptx = backend.make_ptx(llir, md, options, arch)
  return dict(ptx=ptx, ttgir=ttgir_text, llir=str(llir), md=md)


# Kernels compiled once are kept in a folder of their own: jax-triton compiles every
# kernel afresh in each process as it lowers a step, whether or not JAX's persistent
# compilation cache holds the step (one H100, B = 8192: CLIP's training step 6.3 s of
# lowering, fused Matryoshka's 26 s on Triton 3.9 and 18 s on 3.6). Not Triton's cache
# folder, whose entries are ``triton.compile``'s (which jax-triton does not call). By
# default (unset, "" or 1) they are kept in $XDG_CACHE_HOME/memeff_jax/kernels (else
# ~/.cache/memeff_jax/kernels); MEMEFF_JAX_KERNEL_CACHE=PATH keeps them in PATH, =0 none
# (false, off and no too). The folder is bounded: past MEMEFF_JAX_KERNEL_CACHE_MAX_MB
# (default 1024) a store removes the entries used least recently (a load marks its entry
# used) until the rest fill three quarters of it. A process counts the folder (lists every
# entry: 11 ms for 600 on a local disk, more on a network one) at its first store, then
# adds what it stores, and counts again only when that sum would pass the bound: other
# processes' entries since its last count may take the folder past the bound meanwhile.
# Keys change with the kernels' source and with Triton's build, so a folder that is never
# pruned grows with every upgrade and every edit of a kernel (a run of the GPU tests
# leaves 500-630 entries, 98-131 MB on Triton 3.9).
KERNEL_CACHE_ENV = "MEMEFF_JAX_KERNEL_CACHE"
KERNEL_CACHE_MAX_ENV = "MEMEFF_JAX_KERNEL_CACHE_MAX_MB"
KERNEL_CACHE_MAX_MB = 1024
_KERNEL_FILE = "memeff_jax_kernel.json.z"


_OFF, _ON = ("0", "false", "no", "off"), ("1", "true", "yes", "on")


def flax_missing(module: str) -> ImportError:
  """The error of ``module`` (memeff_jax.nnx / .linen) where flax does not import: how
  to install it (an extra)."""
  return ImportError(f"{module} needs flax (and optax to train): pip install flax optax, "
                     f"or from the checkout pip install -e '.[flax]'")


def env_switch(value: str | None) -> bool:
  """An environment switch: off when unset, empty, "0", "false", "no" or "off" (any
  case, spaces around ignored), else on."""
  return (value or "").strip().lower() not in ("",) + _OFF


def kernel_cache_dir() -> pathlib.Path | None:
  """The kernel cache's folder, or None: MEMEFF_JAX_KERNEL_CACHE=0 (or false, off, no),
  TRITON_ALWAYS_COMPILE=1 (Triton's own cache skipped), or JAX_TRITON_DUMP_DIR set
  (jax-triton dumping what it compiles). Unset, empty, 1 (true, yes, on): the default
  folder; anything else names the folder (``~`` expanded). Switches read as
  ``env_switch`` reads them."""
  env = os.environ
  where = env.get(KERNEL_CACHE_ENV, "").strip()
  off = where.lower() in _OFF
  if off or env.get("TRITON_ALWAYS_COMPILE") == "1" or env.get("JAX_TRITON_DUMP_DIR"):
    return None
  if where.lower() not in ("",) + _ON:
    return pathlib.Path(os.path.expanduser(where))
  home = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(home, "memeff_jax", "kernels")


@functools.cache
def _triton_build() -> str:
  """Triton's version and the size and modification time of each file its own cache
  keys hash (its compiler, backends, languages, libdevice and libtriton): Triton's
  ``triton_key`` reads them all (1.5 s for libtriton's 500 MB), this stats them."""
  import triton  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(triton.__file__).parent
  files = [f for sub in ("compiler", "backends", "language", "experimental", "runtime", "_C")
           for f in sorted((root / sub).rglob("*")) if f.is_file()
           and (f.suffix in (".py", ".so", ".bc") or f.name.startswith("libtriton"))]
  stats = [(str(f.relative_to(root)), st.st_size, st.st_mtime_ns)
           for f, st in ((f, f.stat()) for f in files)]
  return f"{triton.__version__} {root} {stats}"


@functools.cache
def _route_source() -> str:
  return inspect.getsource(gluon_ptx)


def kernel_cache_key(text: str, backend, options, target) -> str | None:
  """The cache key of one compile: the kernel's TTIR (``text``, its specialization and
  source lines included) with everything else its compile reads, as Triton keys its
  own (its build, the backend's ptxas and architecture, the options, the environment
  variables that change a compile; its build by ``_triton_build``) plus jax-triton's
  version and this module's Gluon route; None (not cached) for a kernel ``triton_call``
  did not launch (``_OURS``)."""
  found = re.search(r"tt\.func (?:public )?@([\w$.]+)", text)
  if found is None or found.group(1) not in _OURS:
    return None
  jt = jax_triton()
  try:
    from triton._C.libtriton import get_cache_invalidating_env_vars  # pylint: disable=g-import-not-at-top
    env = sorted(get_cache_invalidating_env_vars().items())
  except ImportError:
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(("TRITON_", "MLIR_")))
  opts = options.hash() if hasattr(options, "hash") else repr(options)
  parts = [text, _triton_build(), backend.hash(), opts, repr(target), repr(env),
           getattr(jt, "__version__", "?"), _route_source()]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def kernel_cache_limit() -> int:
  """The kernel cache's bound in bytes: MEMEFF_JAX_KERNEL_CACHE_MAX_MB (MiB, a number > 0),
  else ``KERNEL_CACHE_MAX_MB``; any other value warns and keeps the default."""
  where = os.environ.get(KERNEL_CACHE_MAX_ENV, "")
  try:
    mib = float(where) if where else KERNEL_CACHE_MAX_MB
    if not 0 < mib < float("inf"):
      raise ValueError
  except ValueError:
    warnings.warn(f"{KERNEL_CACHE_MAX_ENV}={where!r} is not a size in MiB (a number > 0): "
                  f"the kernel cache keeps its default bound, {KERNEL_CACHE_MAX_MB} MiB",
                  RuntimeWarning, stacklevel=2)
    mib = KERNEL_CACHE_MAX_MB
  return int(mib * 2**20)


def _cache_load(folder: pathlib.Path, key: str, result):
  """The CompilationResult kept under ``key``, or None (absent, unreadable, or from a
  jax-triton whose result has other fields); a hit marks the entry used (its mtime)."""
  path = folder / key / _KERNEL_FILE
  try:
    compiled = result(**json.loads(zlib.decompress(path.read_bytes())))
  except (OSError, ValueError, TypeError, zlib.error):
    return None
  try:
    os.utime(path)
  except OSError:
    pass   # (a read-only folder: still a hit)
  return compiled


# Bytes this process last counted in each kernel cache folder, plus what it stored since.
_cache_held: dict[pathlib.Path, int] = {}


def _cache_store(folder: pathlib.Path, key: str, compiled) -> None:
  """Keeps ``compiled`` under ``key``: written beside, then renamed into place (atomic,
  so a process reading it meanwhile sees all of it or nothing); then, the first time
  and whenever what this process holds to be there passes the bound, the folder is
  counted and pruned to its bound (``_cache_prune``)."""
  try:
    entry = folder / key
    entry.mkdir(parents=True, exist_ok=True)
    tmp = entry / f"{_KERNEL_FILE}.{os.getpid()}.tmp"
    data = zlib.compress(json.dumps(dataclasses.asdict(compiled)).encode())
    tmp.write_bytes(data)
    os.replace(tmp, entry / _KERNEL_FILE)
  except (OSError, TypeError):
    return   # (an unwritable folder: the next process compiles again)
  limit, held = kernel_cache_limit(), _cache_held.get(folder)
  if held is not None and held + len(data) <= limit:
    _cache_held[folder] = held + len(data)
    return
  try:
    _cache_held[folder] = _cache_prune(folder, limit, keep=key)
  except OSError:
    _cache_held.pop(folder, None)   # (the cache never stops a compile)


def _cache_prune(folder: pathlib.Path, limit: int, keep: str) -> int:
  """Past ``limit`` bytes, removes the entries used least recently (oldest mtime) until
  the rest fill three quarters of it; never ``keep`` (the entry just stored). Returns
  the bytes it leaves, as it counted them. Another process may remove an entry this one
  is about to read: it compiles that kernel again. Only memeff_jax's entries count and
  go (a folder named by a key, holding the kept file or its temporary ones):
  MEMEFF_JAX_KERNEL_CACHE may name a folder holding other things."""
  entries, total = [], 0
  for entry in _listdir(folder):
    if not (re.fullmatch(r"[0-9a-f]{64}", entry.name) and entry.is_dir()):
      continue
    files = [(f, st) for f in _listdir(entry)
             if f.name.startswith(_KERNEL_FILE) and (st := _stat(f)) is not None]
    size = sum(st.st_size for _, st in files)
    total += size
    if entry.name != keep:
      # used: the kept file's mtime; a write under way or a crashed one's leftovers, its
      # temporary file's; an empty folder, never
      used = [st.st_mtime for f, st in files if f.name == _KERNEL_FILE] or [
          st.st_mtime for _, st in files] or [0.0]
      entries.append((max(used), size, entry))
  if total <= limit:
    return total
  for _, size, entry in sorted(entries, key=lambda e: e[0]):
    if total <= limit - limit // 4:
      break
    for f in _listdir(entry):
      try:
        if f.name.startswith(_KERNEL_FILE):
          f.unlink()
      except OSError:
        pass
    try:
      entry.rmdir()
    except OSError:
      pass   # (another process writing into it, or other files: it stays)
    total -= size
  return total


def _listdir(folder: pathlib.Path) -> list:
  try:
    return list(folder.iterdir())
  except OSError:
    return []


def _stat(path: pathlib.Path):
  try:
    return path.stat() if path.is_file() else None
  except OSError:
    return None


@functools.cache
def _compile_hook() -> None:
  """Route jax-triton's compile of TTIR (in memory, once): a Gluon module (jax-triton
  0.4) through ``gluon_ptx``, and memeff_jax's kernels through the kernel cache
  (``kernel_cache_dir``). Other kernels compile as before; with a jax-triton without
  this hook point, every kernel does."""
  tlib = jax_triton().triton_lib
  if not (hasattr(tlib, "compile_ttir_inplace") and hasattr(tlib, "CompilationResult")):
    return
  orig, result = tlib.compile_ttir_inplace, tlib.CompilationResult

  def compile_uncached(ttir, backend, options, *target):
    gpu_target = target[0]
    if (len(target) != 1 or ttir.get_int_attr("ttg.num-warps") is None
        or not hasattr(backend, "gluon_to_ttgir") or not isinstance(gpu_target.arch, int)):
      return orig(ttir, backend, options, *target)
    out = gluon_ptx(ttir, backend, options, gpu_target.arch)
    md = out["md"]
    align = md.get("global_scratch_align")
    return result(binary=out["ptx"], name=md["name"], shared_mem_bytes=md["shared"],
                  ttgir=out["ttgir"], llir=out["llir"],
                  global_scratch_size=md.get("global_scratch_size") or None,
                  global_scratch_align=None if align in (None, 1) else align,
                  tensordesc_meta=md["tensordesc_meta"])

  def compile_ttir_inplace(ttir, backend, options, *target):
    # (the key is read before the compile, which rewrites the module in place)
    folder, key = kernel_cache_dir(), None
    try:   # (the cache never stops a compile: a key it cannot form, no cache)
      key = None if folder is None else kernel_cache_key(str(ttir), backend, options, target)
    except (OSError, ImportError, AttributeError, TypeError, ValueError):
      pass
    compiled = None if key is None else _cache_load(folder, key, result)
    if compiled is None:
      compiled = compile_uncached(ttir, backend, options, *target)
      if key is not None:
        _cache_store(folder, key, compiled)
    return compiled

  tlib.compile_ttir_inplace = compile_ttir_inplace


def triton_call(*args, kernel, out_shapes, grid, name, num_warps, num_stages, **constexprs):
  """``jax_triton.triton_call`` across 0.3.x (``out_shape=``) and 0.4 (``out_type=``),
  FMA contraction on in both (``FP_FUSION``).

  Only ints are passed as Python scalars (both versions map them alike); float
  hyperparameters travel as fp32 arrays; ``Tiles`` become host-side descriptors; kernels
  compile through ``_compile_hook`` (Gluon's route, the kernel cache).
  """
  jt = jax_triton()
  _launch_compiled_warps()
  _compile_hook()
  assert not any(isinstance(a, float) for a in args), "pass floats as fp32 arrays"
  args = [a.descriptor() if isinstance(a, Tiles) else a for a in args]
  _OURS.add(getattr(getattr(kernel, "fn", None), "__name__", None))
  out, options = _triton_call_kwargs()
  return jt.triton_call(*args, kernel=kernel, grid=grid, name=name, num_warps=num_warps,
                        num_stages=num_stages, **{out: out_shapes}, **options, **constexprs)


def compiled_warps(binary, num_warps: int) -> int:
  """The warps a kernel must be launched with: its PTX's ``.reqntid`` / 32 where the
  compiled kernel asks for a width of its own (a warp-specialized kernel counts every
  partition's warps: 4 asked, 12 compiled for a Hopper producer and two consumer
  warp groups), else ``num_warps``."""
  if isinstance(binary, str):
    found = re.search(r"^\s*\.reqntid\s+(\d+)", binary, re.MULTILINE)
    if found and int(found.group(1)) % 32 == 0:
      return int(found.group(1)) // 32
  return num_warps


# CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN (cuda.h)
_SMEM_OPTIN = 97


@functools.cache
def max_shared_bytes(ordinal: int = 0) -> int | None:
  """The shared memory a block may use on CUDA device ``ordinal`` (bytes, the opt-in
  maximum: the bound jaxlib's launch checks), read from the driver; None where it
  cannot be read (no CUDA driver)."""
  try:
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, value = ctypes.c_int(), ctypes.c_int()
    if (cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(dev), ordinal)
        or cuda.cuDeviceGetAttribute(ctypes.byref(value), _SMEM_OPTIN, dev)):
      return None
  except (OSError, AttributeError):
    return None
  return value.value


# The kernels launched through ``triton_call`` (their functions' names, which Triton
# gives the compiled kernels): the shared-memory check is theirs alone, so that another
# library's jax-triton kernels in the same process fail as jaxlib fails them.
_OURS: set[str] = set()


def check_shared_memory(name: str, shared: int, limit: int | None) -> None:
  """A ``ValueError`` naming ``config`` where kernel ``name`` (one of ``_OURS``)
  compiled to more shared memory than ``limit`` (bytes; None: unknown, no check).
  Raised while the kernel is compiled, at jit time: the launch would fail at run time,
  in XLA's custom call."""
  if name in _OURS and limit is not None and shared > limit:
    raise ValueError(
        f"config: kernel {name} needs {shared} bytes of shared memory a block, more than "
        f"the {limit} this GPU allows; pass a KernelConfig with smaller tiles (block_m, "
        f"block_n, block_d) or fewer num_stages (memeff_jax.config.fit_smem fits one to "
        f"the GPU's KiB and compute capability major, its arch)")


class _CompiledWarps:
  """jaxlib's ``gpu_triton`` as jax-triton sees it, except that ``TritonKernel`` (name,
  num_warps, num_ctas, shared memory, binary, ...; 0.3.1 and 0.4 alike) launches with
  ``compiled_warps``: jax-triton passes the ``num_warps`` it was called with, which a
  warp-specialized kernel's launch must not use (CUDA refuses a launch narrower than
  ``.reqntid``); and one of memeff_jax's kernels whose shared memory exceeds the GPU's
  (``max_shared_bytes``) is refused with ``check_shared_memory``'s ValueError. Every
  other kernel launches as before."""

  def __init__(self, lib, smem_limit=max_shared_bytes):
    self._lib = lib
    self._smem_limit = smem_limit

  def __getattr__(self, name):
    return getattr(self._lib, name)

  def TritonKernel(self, name, num_warps, num_ctas, shared, binary, *rest):  # pylint: disable=invalid-name
    check_shared_memory(name, shared, self._smem_limit())
    return self._lib.TritonKernel(name, compiled_warps(binary, num_warps), num_ctas, shared,
                                  binary, *rest)


@functools.cache
def _launch_compiled_warps() -> None:
  """Route jax-triton's kernel construction through ``_CompiledWarps`` (in memory, once;
  jaxlib's own Pallas launches are left alone)."""
  triton_lib = jax_triton().triton_lib
  lib = getattr(triton_lib, "triton_kernel_call_lib", None)
  if lib is not None and not isinstance(lib, _CompiledWarps):
    triton_lib.triton_kernel_call_lib = _CompiledWarps(lib)
