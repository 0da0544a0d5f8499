"""The device-run tooling in benchmarks/: the GPU tests' sharding by expected time and
their ledger (which must hold a run of every GPU test on each tested stack), the tables
rendered from the CSVs of the device runs, and the hardware counters' summary."""

import os
import pathlib
import random
import subprocess
import sys

import pytest

from benchmarks import ncu_kernels, render_tables, shard_tests


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


def test_ledger_keeps_each_ids_outcome_and_lists_the_pending(tmp_path, capsys):
  # Two runs at one commit and stack, one at another commit: an id's row is its latest
  # outcome, except that an id passed earlier and not reached later stays passed; the
  # pending ids are those not passed at that commit and stack, in --ids' order.
  ids = [f"tests/test_gpu.py::test_{k}" for k in ("a[x-1]", "a[x-2]", "b", "c", "d")]
  path, log1, log2 = tmp_path / "ledger.csv", tmp_path / "1.log", tmp_path / "2.log"
  log1.write_text(f"{ids[0]} PASSED [ 20%]\n{ids[1]} FAILED [ 40%]\n"
                  f"{ids[2]} ERROR [ 60%]\n12.50s call     {ids[0]}\n"
                  f"FAILED {ids[1]} - AssertionError\n")
  log2.write_text(f"{ids[1]} PASSED [ 50%]\n{ids[3]} XFAIL [100%]\n")
  run = dict(stack="s39", gpu="H100", path=path)
  assert shard_tests.ledger([log1], ids, date="d1", commit="c1", **run) == {
      "passed": 1, "failed": 1, "error": 1, "not run": 2}
  assert shard_tests.ledger([log2], ids, date="d2", commit="c1", **run) == {
      "passed": 1, "xfailed": 1, "not run": 2}   # (ids[0] kept: passed in run 1)
  rows = {r["id"]: r for r in shard_tests.read_ledger(path)}
  assert [rows[i]["outcome"] for i in ids] == ["passed", "passed", "not run", "xfailed",
                                                "not run"]
  assert (rows[ids[0]]["date"], rows[ids[0]]["seconds"]) == ("d1", "12.50")
  shard_tests.ledger([log1], ids[:2], date="d3", commit="c2", **run)
  assert shard_tests.pending(ids, commit="c1", stack="s39", path=path) == ids[2:]
  assert shard_tests.pending(ids, commit="c2", stack="s39", path=path) == ids[1:]
  assert shard_tests.pending(ids, commit="c1", stack="s36", path=path) == ids
  # the command line prints the pending ids
  (tmp_path / "ids").write_text("\n".join(ids) + "\n")
  shard_tests.main(["--pending", "--ids", str(tmp_path / "ids"), "--commit", "c1",
                    "--stack", "s39", "--ledger-file", str(path)])
  assert capsys.readouterr().out.split() == ids[2:]


def test_unrun_lists_ids_that_never_held_on_a_stack(tmp_path):
  # Passed or skipped at some commit counts; a failure dated after an id's latest pass
  # does not; other stacks' rows say nothing of this one.
  ids = [f"tests/test_gpu.py::test_{k}" for k in "abcdef"]
  path, log1, log2, log3 = (tmp_path / n for n in ("ledger.csv", "1.log", "2.log", "3.log"))
  log1.write_text(f"{ids[0]} PASSED\n{ids[1]} SKIPPED\n{ids[2]} PASSED\n"
                  f"{ids[3]} FAILED\n")
  log2.write_text(f"{ids[2]} FAILED\n{ids[3]} PASSED\n")
  log3.write_text(f"{ids[4]} PASSED\n")
  run = dict(stack="s39", gpu="H100", path=path)
  shard_tests.ledger([log1], ids[:4], date="2026-12-01", commit="c1", **run)
  shard_tests.ledger([log2], ids[2:4], date="2026-12-02", commit="c2", **run)
  shard_tests.ledger([log3], ids[4:5], date="2026-12-02", commit="c2", stack="s36",
                     gpu="H100", path=path)
  assert shard_tests.unrun(ids, stack="s39", path=path) == [ids[2], ids[4], ids[5]]
  assert shard_tests.unrun(ids, stack="s36", path=path) == ids[:4] + ids[5:]


def test_edited_lists_ids_that_held_only_in_an_earlier_form(tmp_path, capsys):
  # A repository whose test file changes after the ids pass: a changed body or
  # parametrization makes an id edited on a stack until it passes again in the new
  # form; a comment or a reflow does not; an id that never held is unrun's, not
  # edited's; each stack by its own rows; a commit git cannot show is another form.
  git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True,
                                  capture_output=True, text=True).stdout.strip()
  git("init", "-q")
  git("config", "user.email", "t@t")
  git("config", "user.name", "t")
  tests = tmp_path / "tests" / "test_gpu.py"
  tests.parent.mkdir()

  def commit(source):
    tests.write_text(source)
    git("add", "-A")
    git("-c", "commit.gpgsign=false", "commit", "-q", "-m", "c")
    return git("rev-parse", "--short", "HEAD")

  c1 = commit("def test_a():\n  assert 1\n\n\ndef test_b():\n  assert 2\n\n\n"
              "def test_c():\n  assert 3\n")
  c2 = commit("def test_a():\n  # why\n  assert (\n      1)\n\n\ndef test_b():\n"
              "  assert 2 + 0\n\n\ndef test_c():\n  assert 3 + 0\n")
  ids = [f"tests/test_gpu.py::test_{k}[x]" for k in "abcd"]
  path, log1, log2 = tmp_path / "ledger.csv", tmp_path / "1.log", tmp_path / "2.log"
  log1.write_text("".join(f"{i} PASSED\n" for i in ids[:3]))
  log2.write_text(f"{ids[2]} SKIPPED\n")
  run = dict(date="d", gpu="H100", path=path, repo=tmp_path)
  shard_tests.ledger([log1], ids[:3], commit=c1, stack="s39", **run)
  shard_tests.ledger([log2], ids[2:3], commit=c2, stack="s39", **run)
  shard_tests.ledger([log1], ids[:3], commit="0000000", stack="s36", **run)
  assert shard_tests.edited(ids, stack="s39", path=path, repo=tmp_path) == [ids[1]]
  assert shard_tests.edited(ids, stack="s36", path=path, repo=tmp_path) == ids[:3]
  assert shard_tests.edited(ids, stack="s31", path=path, repo=tmp_path) == []
  # Each row keeps its function's form at its commit: without git (a shallow or
  # exported tree) the answers stand.
  assert {r["form"] for r in shard_tests.read_ledger(path) if r["commit"] == "0000000"} == {""}
  saved = tmp_path / "saved.git"
  (tmp_path / ".git").rename(saved)
  assert shard_tests.edited(ids, stack="s39", path=path, repo=tmp_path) == [ids[1]]
  assert shard_tests.edited(ids, stack="s36", path=path, repo=tmp_path) == ids[:3]
  saved.rename(tmp_path / ".git")
  (tmp_path / "ids").write_text("".join(f"{i}\n" for i in ids))
  shard_tests.main(["--edited", "--ids", str(tmp_path / "ids"), "--stack", "s39",
                    "--ledger-file", str(path), "--repo", str(tmp_path)])
  assert capsys.readouterr().out.split() == [ids[1]]


def test_every_gpu_test_ran_on_each_tested_stack():
  # Each id of tests/test_gpu.py has held (passed, or skipped by design) on every GPU row
  # of the README's "Tested" table, per gpu_tests_ledger.csv, in its test function's
  # present form: a GPU test added, renamed or edited (body or parametrization) without
  # a device run on each stack fails here.
  root = pathlib.Path(__file__).resolve().parents[1]
  env = dict(os.environ, MEMEFF_TEST_GPU="1")
  out = subprocess.run(
      [sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=",
       "-p", "no:cacheprovider", "-m", "gpu or not gpu", "tests/test_gpu.py"],
      cwd=root, env=env, capture_output=True, text=True, timeout=300, check=True).stdout
  ids = [l for l in out.splitlines() if l.startswith("tests/test_gpu.py::")]
  stacks = [f"jax-triton {jt} + Triton {t}" for jt, t in shard_tests.tested_pairs()]
  assert len(ids) > 300 and len(stacks) >= 2
  assert {s: shard_tests.unrun(ids, stack=s)[:5] for s in stacks} == {s: [] for s in stacks}
  assert {s: shard_tests.edited(ids, stack=s)[:5] for s in stacks} == {s: [] for s in stacks}


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


def test_llm_table_has_a_row_per_loss_and_feature_size(tmp_path):
  # table:llm from PREFIX_llm_{triton,memeff}.csv: one row per (loss, D) in the losses'
  # order, then D; memeff's time over ours; a row memeff did not run (SigLIP) gets "-".
  results = tmp_path / "results"
  results.mkdir()
  header = "bench,provider,batch,dim,dtype,ms,ms_min,extra_gib,tflops\n"
  ours = {("siglip", 2560): 90.0, ("clip", 4096): 300.0, ("clip", 2560): 200.0}
  theirs = {("clip", 4096): 750.0, ("clip", 2560): 410.0}
  for prov, cells in (("triton", ours), ("memeff", theirs)):
    (results / f"gpu_llm_{prov}.csv").write_text(header + "".join(
        f"{n},{prov},65536,{d},bfloat16,{ms},{ms},0.5,600\n" for (n, d), ms in cells.items()))
  bench = tmp_path / "benchmarks.md"
  bench.write_text("<!-- table:llm -->\nold\n<!-- /table:llm -->\n")
  readme = tmp_path / "README.md"
  readme.write_text("")
  render_tables.main(["--results", str(results), "--readme", str(readme), "--benchmarks",
                      str(bench), "--prefix", "gpu"])
  rows = [l for l in bench.read_text().splitlines() if l.startswith("| ") and "---" not in l]
  assert [r.split(" | ")[:2] for r in rows[1:]] == [["| CLIP", "2560"], ["| CLIP", "4096"],
                                                    ["| SigLIP", "2560"]]
  assert rows[1].endswith(f"| {410 / 200:.2f}x |") and rows[2].endswith(f"| {750 / 300:.2f}x |")
  assert rows[3].endswith("| - | - |") and "| 90.0 ms, 600 TFLOP/s, 0.50 GiB |" in rows[3]


def test_ncu_summary_keeps_named_metrics_and_shares_samples_by_opcode(tmp_path):
  # A raw page (a line before the header, a column a metric, a row of units, a row a
  # launch; numbers with thousands separators) and a SASS page (a header row a launch)
  # as ncu writes them with --csv: the summary keeps KEEP's metrics of each launch and no other, gives each opcode's
  # share of the launch's sampled warps (a predicate is not part of the opcode) and the
  # stall reasons' shares of the samples not on NOP.
  stall = "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
  (tmp_path / "p.raw.csv").write_text(
      '==WARNING== a line ncu may print before the header\n'
      '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes.sum",'
      f'"{stall}","sm__pipe_xu_cycles_active.avg.pct_of_peak_sustained_active"\n'
      '"","","ns","byte","",""\n'
      '"0","_wide_kernel","14,300,123","5","2.5","40.1"\n'
      '"1","_lse_bwd_kernel","2,000","7","0.5","n/a"\n')
  head = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling '
          '(Not-issued Samples)","stall_barrier","stall_wait","stall_barrier (Not Issued)"\n')
  (tmp_path / "p.sass.csv").write_text(
      head +
      '"0x10","@!P0 MUFU.EX2 R1, R2 ;","30","20","0","30","0"\n'
      '"0x20","MUFU.EX2 R3, R4 ;","10","5","2","8","2"\n'
      '"0x30","HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;","60","60","10","50","10"\n'
      '"0x40","NOP ;","100","100","100","0","100"\n' +
      head +
      '"0x10","FFMA R1, R2, R3, R4 ;","1,000","0","0","1,000","0"\n')
  rows = ncu_kernels.summarize(tmp_path)
  got = {(r["launch"], r["metric"]): (r["kernel"], r["unit"], r["value"]) for r in rows}
  assert got[(0, "gpu__time_duration.sum")] == ("_wide_kernel", "ns", 14300123.0)
  assert got[(0, stall)] == ("_wide_kernel", "", 2.5)
  assert got[(1, "gpu__time_duration.sum")] == ("_lse_bwd_kernel", "ns", 2000.0)
  assert (0, "dram__bytes.sum") not in got              # not in KEEP
  assert (1, "sm__pipe_xu_cycles_active.avg.pct_of_peak_sustained_active") not in got  # n/a
  assert got[(0, "sampled:MUFU.EX2")][2] == pytest.approx(0.2)
  assert got[(0, "sampled:HGMMA.64x64x16")][2] == pytest.approx(0.3)
  assert got[(0, "sampled:NOP")][2] == pytest.approx(0.5)
  assert got[(1, "sampled:FFMA")][2] == pytest.approx(1.0)
  # the stall reasons of the samples not on NOP (padding warps idle there), Not Issued
  # columns aside: barrier 12 and wait 88 of 100
  assert got[(0, "stall:barrier")][2] == pytest.approx(0.12)
  assert got[(0, "stall:wait")][2] == pytest.approx(0.88)
  assert got[(1, "stall:wait")][2] == pytest.approx(1.0)
  top = (tmp_path / "p.sass_top.txt").read_text().splitlines()
  assert top[0].startswith("== launch 0: 4 instructions, 200 samples")
  assert "NOP" in top[1] and "HGMMA" in top[2] and "30.00%" in top[2]
  assert "_wide_kernel" in ncu_kernels.table(rows) and "wait 2.5" in ncu_kernels.table(rows)
  assert "working warps' samples: wait 88.0%, barrier 12.0%" in ncu_kernels.table(rows)
