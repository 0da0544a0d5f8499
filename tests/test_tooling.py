"""The device-run tooling in benchmarks/: the GPU tests' sharding by expected time, and
the tables rendered from the CSVs of the device runs."""

import random

import pytest

from benchmarks import render_tables, shard_tests


def test_shards_split_every_id_once_and_balance_time(tmp_path):
  # 120 ids of random durations over 3 test functions, 14 shards a call, 2 calls: every
  # id lands in exactly one shard, and the shards' times differ by at most the longest
  # id (greedy longest-first bound); an unrecorded id takes its function's median.
  rng = random.Random(0)
  ids = [f"tests/test_gpu.py::test_{f}[{k}]" for f in "abc" for k in range(40)]
  known = {i: rng.uniform(1, 120) for i in ids[1:]}
  seconds = shard_tests.expected(ids, known)
  a = sorted(known[i] for i in ids[1:40])
  assert seconds[ids[0]] == a[19]   # (the middle of 39)
  lists = shard_tests.shards(ids, seconds, 28)
  assert sorted(i for l in lists for i in l) == sorted(ids)
  loads = [sum(seconds[i] for i in l) for l in lists]
  assert max(loads) - min(loads) <= max(seconds.values())
  # the command line: the calls' shard files hold every id once
  (tmp_path / "ids").write_text("\n".join(ids) + "\n")
  got = []
  for call in range(2):
    shard_tests.main(["--ids", str(tmp_path / "ids"), "--shards", "14", "--calls", "2",
                      "--call", str(call), "--out", str(tmp_path / str(call))])
    files = sorted((tmp_path / str(call)).iterdir())
    assert len(files) == 14
    got += [l for f in files for l in f.read_text().split()]
  assert sorted(got) == sorted(ids)


def test_record_reads_call_durations(tmp_path):
  log = tmp_path / "gpu_tests.log"
  log.write_text("12.50s call     tests/test_gpu.py::test_a[x-1]\n"
                 "0.20s setup    tests/test_gpu.py::test_a[x-1]\n"
                 "3.00s call     tests/test_gpu.py::test_b\n")
  path = tmp_path / "durations.csv"
  assert shard_tests.record([log], path) == 2
  assert shard_tests.read_durations(path) == {"tests/test_gpu.py::test_a[x-1]": 12.5,
                                              "tests/test_gpu.py::test_b": 3.0}


def _headline_csvs(results, prefix, ours_ms, theirs_ms):
  header = "bench,provider,batch,dim,dtype,ms,ms_min,extra_gib,tflops\n"
  for prov, ms in (("triton", ours_ms), ("memeff", theirs_ms)):
    (results / f"{prefix}_headline_{prov}.csv").write_text(
        header + f"clip,{prov},65536,512,bfloat16,{ms},{ms},0.25,400\n")


def test_markers_render_from_their_prefix(tmp_path):
  # A marker named NAME@PREFIX is rendered from PREFIX_*.csv, a plain one from --prefix's;
  # a marker without CSVs keeps its text; --check then finds both files current.
  results = tmp_path / "results"
  results.mkdir()
  _headline_csvs(results, "gpu", 50.0, 75.0)
  _headline_csvs(results, "gpu_new", 40.0, 80.0)
  readme, bench = tmp_path / "README.md", tmp_path / "benchmarks.md"
  readme.write_text("<!-- table:headline@gpu_new -->\nold\n<!-- /table:headline@gpu_new -->\n")
  bench.write_text("<!-- table:headline -->\nold\n<!-- /table:headline -->\n"
                   "<!-- table:mrl@gpu_new -->\nkept\n<!-- /table:mrl@gpu_new -->\n")
  args = ["--results", str(results), "--readme", str(readme), "--benchmarks", str(bench),
          "--prefix", "gpu"]
  render_tables.main(args)
  new, old = readme.read_text(), bench.read_text()
  assert "| CLIP | 40.0 ms" in new and "2.00x" in new and "old" not in new
  assert "| CLIP | 50.0 ms" in old and "1.50x" in old and "kept" in old
  with pytest.raises(SystemExit) as done:
    render_tables.main(args + ["--check"])
  assert done.value.code == 0
