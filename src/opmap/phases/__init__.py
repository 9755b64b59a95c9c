"""Phases of a model's life built on the one-graph pipeline (opmap.analyze): the runtime a step runs under
(eager launches, CUDA / HIP / HPU graphs, a serving engine's fused kernels), and, later, prefill, decode and
train figures. serve, sweep, plan and fit import the phase pieces they need from here."""
