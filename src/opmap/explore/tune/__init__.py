"""Runtime autotuning (``opmap tune MODEL``): the cost model ranks each operator signature's candidate mappings,
the top few are timed on the device with the one timer (opmap.timing), the winner is chosen by measurement and
cached by device and shape, and the ranking's accuracy is reported (Kendall's tau).

- signatures.py: the distinct GEMM / conv / attention / norm signatures of a captured plan;
- candidates.py: the CPU candidates (threads, dtype, channels_last, SDPA backend, GEMM chunking) and the
  operator each runs; gpu.py: the Triton / cuBLAS candidates of a CUDA device (enumerated and ranked; timed
  only where a GPU is present);
- rank.py: the cost model's prediction of a candidate and Kendall's tau-b;
- cache.py: the JSON cache keyed by device fingerprint, versions, signature and candidate list;
- apply.py: the chosen mappings put onto a real model (the whole-model gain is measured);
- run.py: the loop; tuned.py: ``analyze --tuned``'s predictions under the cached choices.
"""

from opmap.explore.tune.rank import kendall_tau
from opmap.explore.tune.run import SCHEMA_VERSION, tune

__all__ = ["SCHEMA_VERSION", "kendall_tau", "tune"]
