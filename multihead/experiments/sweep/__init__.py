"""Sweeps over a config: grid and random trials, local and Ray backends, Optuna search."""
