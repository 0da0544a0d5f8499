"""The Triton backend: kernels (``stats_fwd``, ``grad_bwd``, ``_common``), their launch
(``call``, ``interpreter``), the forward and backward launchers, the Matryoshka
``ladder`` and ``TritonBackend``. Nothing here is imported until the registry resolves
"triton" or "interpret"."""
