"""Calibration: measure this device's real ceilings and write them as a hardware profile.

Microbenchmarks (run.py), each with warm-up, repeats, the median and the spread (min, max, interquartile
range; opmap.timing):

- matmul rate per format (fp32, bf16, fp16 where the device runs them) over a grid of shapes in
  nn.Linear's layout (m from 16 to 4096, n and k from 256 to 4096) and with a transposed left operand, so
  the profile carries an efficiency curve by size and aspect, not one number; the matrix peak is the best
  median over the grid;
- convolutions (ResNet and ViT layer shapes, batch 1 and 8) stored as implicit GEMMs, forward and (fp32)
  backward, and fused attention (scaled_dot_product_attention over sequence lengths, causal and not);
- copy, read and write bandwidth over sizes that cross the cache levels (copy counts read + write bytes);
  the memory bandwidth is the copy rate at the largest size (past the last-level cache);
- per-op dispatch / launch overhead (a one-element add), the host cost of a view op;
- vector (pointwise) rate, the transcendental rate (exp, tanh, erf) and one rate per vector family (softmax,
  layer norm, batch norm, max pooling, reductions) in the cost rules' own FLOPs (it captures and costs its
  own benchmark ops, which is why calibration sits above capture and costs).

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
