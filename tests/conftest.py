"""Test setup: 8 forced host devices for the ring tests and Triton's interpreter on
CPU-only machines. Both must be set before jax / triton are first imported."""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
# On a GPU machine the Triton kernels compile for the GPU ("-m gpu" tests); elsewhere
# they run under the interpreter (backend="interpret").
HAS_GPU = os.path.exists("/dev/nvidia0") or os.environ.get("MEMEFF_TEST_GPU") == "1"
if not HAS_GPU:
  os.environ.setdefault("TRITON_INTERPRET", "1")
  # The CPU tests run tiny arrays, and compiling is most of their time: XLA's LLVM
  # passes at their lowest level cut it by 40% (four blockwise cases of test_qwen3,
  # test_clip_lit and test_matryoshka: 33 -> 20 s; the default suite 3,633 -> 1,397 s on
  # 2 cores with the samples' cuts). Its fp32 rounding differs a little: one tolerance
  # moved (test_ring._assert_same, the temperature's gradient).
  if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += (" --xla_backend_optimization_level=0"
                                " --xla_llvm_disable_expensive_passes=true")
else:   # several pytest processes (pytest-xdist) share the GPU
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  # The tests time nothing: XLA's GEMM autotuning (dozens of compiled variants per dot of
  # the dense references, on every core) would only slow the compile-bound GPU tests.
  if "xla_gpu_autotune_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_gpu_autotune_level=0"

# Shared test code (tests/support/__init__.py), and scripts the tests start in
# subprocesses: no test modules, no doctests.
collect_ignore_glob = ["support/*"]

import jax  # noqa: E402  pylint: disable=g-import-not-at-top
import pytest  # noqa: E402  pylint: disable=g-import-not-at-top


def pytest_collection_modifyitems(config, items):
  if HAS_GPU:
    return
  skip = pytest.mark.skip(reason="needs a CUDA GPU with jax-triton (run on the device)")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _cpu_devices():
  if not HAS_GPU:
    assert jax.device_count() >= 8, "XLA_FLAGS was set too late: jax was imported first"


def pytest_sessionfinish(session):
  # A pytest-xdist worker hands its largest errors to the controller process.
  out = getattr(session.config, "workeroutput", None)
  if out is not None:
    from tests.support import check as _check  # pylint: disable=g-import-not-at-top
    out["largest_errors"] = dict(_check.LARGEST)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
  del error
  from tests.support import check as _check  # pylint: disable=g-import-not-at-top
  for dtype, errs in getattr(node, "workeroutput", {}).get("largest_errors", {}).items():
    worst = _check.LARGEST.setdefault(dtype, [0.0, 0.0])
    worst[:] = [max(a, b) for a, b in zip(worst, errs)]


def pytest_terminal_summary(terminalreporter):
  from tests.support import check as _check  # pylint: disable=g-import-not-at-top
  for dtype, (v, g) in sorted(_check.LARGEST.items()):
    terminalreporter.write_line(f"largest errors vs the float64 reference, {dtype}: "
                                f"value {v:.2e} (relative), gradient {g:.2e} "
                                f"(relative to the largest entry)")
