"""Phases of a model's life built on the one-graph pipeline (opmap.analyze): the runtime a step runs under
(``runtime``: eager launches, CUDA / HIP / HPU graphs, a serving engine's fused kernels), the figures of each phase
(``prefill``: time to first token; ``decode``: time per output token, its memory floor and fit; ``train``: the
iteration, MFU and HFU, recomputation, the training memory fit; ``sharded``: a phase's figures over a layout of
several devices) and ``step``: capture a phase's step, run the pipeline on it and set its figures. serve, sweep,
plan, fit and the CLI import the phase pieces they need from here."""
