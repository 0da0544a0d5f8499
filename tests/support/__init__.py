"""What the tests share, each defined once. Import the module you need; nothing here is
re-exported, and no test module imports another test module.

``data``        generators: ``features(seed, shapes, dtype)`` (independent normals),
                ``towers(b, d, seed, *, noise, k, hard_noise, tau_max)`` (paired towers,
                hard negatives, per-row tau_plus, for small API tests; bind a module's
                sizes with ``functools.partial``), ``qwen3_batch`` (near-duplicates the
                Qwen3 mask drops), ``with_exact_ties``, ``ring_batch``, ``graded_rows``
                (spread log-sum-exps) and its ``BOUNDED_CASES``, ``where_mask``; inputs
                clear of a discontinuity, for 16-bit cases: ``decisive_margin`` (from
                ``margin_offsets``: no candidate within rounding of the Qwen3
                threshold) and ``decisive_tau_plus`` (from ``debias_ratios``: no
                softmax near the debiased clamp).
``families``    ``FAMILIES``: name -> ``Family`` (loss, with_stats, reference,
                reference_with_stats, n_arrays, class_name, options); ``BACKENDS`` (the
                CPU backends checked against the reference: blockwise, interpret) and
                ``ALL_BACKENDS`` (also "reference"); ``eager_matryoshka`` (the eager
                wrapper over a reference, the oracle of one block per dim).
``oracle``      float64 numpy written from docs/math.md, independent of memeff_jax:
                ``clip``, ``qwen3`` (loops over rows), ``normalize``, ``block_lse64``,
                ``count_pairs``, ``count_qwen3``.
``tolerances``  ``FP32``, ``LOW`` (dtype -> atols and the gradient bound's cap),
                ``grad_err``, ``rel_err``.
``check``       ``compare(fn, ref_fn, arrays, ...)``: values and gradients under jit vs
                the float64 reference with those tolerances; ``sampled`` / ``checkerboard``
                (the fixed default sample of a product, the rest marked slow);
                ``kernel_path_config`` (one Triton kernel path under the interpreter);
                ``jaxpr_eqns``.
``st_reference`` float64 jax transcription of sentence-transformers 6.3.0's
                ``MultipleNegativesRankingLoss`` (``mnrl``, ``gte``), checked against
                the library; the oracle of tests/test_porting.py.
``towers``      two MLP towers for grad_cache: ``params``, ``batch``, ``embed``,
                ``loss(family)``, ``plain`` (the oracle) and ``assert_close``.
``compile``     ``compile_kernel``: a Triton kernel compiled for a CUDA target without a
                GPU (also used by benchmarks/sass_fingerprint.py).

Scripts the tests run in subprocesses: ``compiled_smem.py`` (shared memory of kernels
compiled for a smaller GPU) and ``distributed_worker.py`` (one process of the
two-process ``jax.distributed`` test). conftest.py keeps pytest from collecting this
package (no tests, no doctests).
"""
