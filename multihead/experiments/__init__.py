"""Experiments from configs: `config/` (schema, rules, YAML), `build/` (config -> library
objects, data), `run/` (task runners, run guard, saved runs), `sweep/` (trials, Ray, Optuna)
and `results/` (comparisons). The `multihead` command on top of them is `multihead.cli`."""
