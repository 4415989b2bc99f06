"""From a validated config to library objects: model, objectives, trainer, data."""
