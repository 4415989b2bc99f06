"""The error every config check raises: a leaf module, so any part of the config package
(and the modules that check config sections) can raise it without importing the schema."""


class ConfigError(ValueError):
    """A config value is missing, unknown or of the wrong type; the message says where."""
