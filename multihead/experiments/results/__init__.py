"""Reading finished runs against each other: comparison tables and plots."""
