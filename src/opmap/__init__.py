"""opmap: map a neural-network workload onto hardware and prove where the time goes."""

__version__ = "0.1.0"
