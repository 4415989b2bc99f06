"""The `multihead` command. Nothing in the package imports this package."""
