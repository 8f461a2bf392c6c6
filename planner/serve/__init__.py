"""Serving many models on one cluster with model parallelism (AlpaServe-style): workload, simulator, placement (pure core)."""
