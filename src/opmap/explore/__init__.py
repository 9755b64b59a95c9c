"""Searches over layouts, sweeps and platforms, built on the analyze pipeline."""
