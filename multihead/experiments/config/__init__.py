"""Experiment configs: the typed schema, the cross-field rules and the YAML 1.2 reader."""
