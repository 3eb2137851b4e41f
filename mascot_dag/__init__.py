"""MASCOT-DAG: multi-agent socio-collaborative companions as a Dagster asset graph."""

import os

# Busy-waiting OpenMP threads make torch ~10x slower when the cores are shared (measured on
# 2 shared cores: 69 s vs 6.9 s for the same generation). Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
