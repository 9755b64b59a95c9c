"""Calibration: measure this device's real ceilings and write them as a hardware profile.

Microbenchmarks (run.py), each with warm-up, repeats, the median and the spread (min, max, interquartile
range; opmap.timing):

- matmul rate per format (fp32, bf16, fp16 where the device runs them; each shape timed in every format at once,
  interleaved, so a load that comes and goes on a shared host falls on all formats alike) over a grid of shapes in
  nn.Linear's layout (m from 16 to 4096, n and k from 256 to 4096) and with a transposed left operand, so
  the profile carries an efficiency curve by size and aspect, not one number; the matrix peak is the best
  median over the grid; then each format's ceiling, one large square GEMM through the kernel torch dispatches
  for it (oneDNN's bf16 path on AVX-512 BF16 CPUs), all formats at one size, interleaved;
- convolutions (ResNet and ViT layer shapes, batch 1 and 8) stored as implicit GEMMs, forward and (fp32)
  backward, and fused attention (scaled_dot_product_attention over sequence lengths, causal and not);
- copy, read and write bandwidth over sizes that cross the cache levels (copy counts read + write bytes);
  the memory bandwidth is the copy rate at the largest size (past the last-level cache);
- per-op dispatch / launch overhead (a one-element add), the host cost of a view op;
- vector (pointwise) rate, the transcendental rate (exp, tanh, erf) and one rate per vector family (softmax,
  layer norm, batch norm, max pooling, reductions) in the cost rules' own FLOPs (it captures and costs its
  own benchmark ops, which is why calibration sits above capture and costs); on a multi-threaded CPU, a parallel
  region's fork / join cost (``parallel_overhead``: what opmap tune charges a multi-threaded candidate).

A full run keeps to a time budget of about a minute (grids.BUDGET_S, per format and family, and for bandwidth):
under a load that slows every shape, the shapes past their share are skipped and listed; ``--no-budget`` lifts it.

The grids are in grids.py; the machine fingerprint in fingerprint.py; the profile (catalog schema, every
value ``measured``, the curves under ``[calibration]``) is written by profile_file.py to
``$XDG_CACHE_HOME/opmap/local.toml`` (hardware/local.py), where ``--hardware local`` finds it; drift.py
re-times one calibrated GEMM at profile time.
"""

from opmap.calibrate.drift import DRIFT_TOLERANCE, calibration_check
from opmap.calibrate.fingerprint import device_name, fingerprint
from opmap.calibrate.grids import MAX_CALL_S, steps
from opmap.calibrate.profile_file import to_spec_dict, to_toml, write_profile
from opmap.calibrate.run import Calibration, calibrate

__all__ = ["DRIFT_TOLERANCE", "MAX_CALL_S", "Calibration", "calibrate", "calibration_check", "device_name",
           "fingerprint", "steps", "to_spec_dict", "to_toml", "write_profile"]
