"""Running a config: the runners of each task, the run guard, saved runs, dry runs, hparams."""
