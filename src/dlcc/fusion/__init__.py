"""Fusion: graph IR -> FusionPlan (analysis only; the graph is not mutated)."""
