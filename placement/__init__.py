"""Placement experiments on a simulated fleet: random, least-loaded and prediction-guided placement."""
