"""examples/digits_matryoshka.py runs top to bottom: a few training steps
(``DIGITS_STEPS``), every Matryoshka dim evaluated, the PNG written (``DIGITS_PNG``).
In a subprocess, on one CPU device; about 20 s."""

import os
import pathlib
import subprocess
import sys

import pytest

for name in ("flax", "optax", "sklearn", "matplotlib"):
  pytest.importorskip(name)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_digits_matryoshka_runs(tmp_path):
  png = tmp_path / "digits.png"
  env = dict(os.environ, DIGITS_STEPS="5", DIGITS_PNG=str(png), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # conftest's 8 forced host devices: not needed here
  result = subprocess.run([sys.executable, str(ROOT / "examples" / "digits_matryoshka.py")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr
  for dim in (8, 16, 32, 64):
    assert f"dim {dim:3d}: held-out view retrieval top-1" in result.stdout
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_large_batch_nnx_runs(tmp_path):
  # Both steps compiled, the budget between them (the script asserts it), a few
  # grad_cache steps.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  result = subprocess.run([sys.executable, str(ROOT / "examples" / "large_batch_nnx.py"), "3"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "plain step needs" in result.stdout and "step   2: loss" in result.stdout
