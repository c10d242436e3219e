"""The errors a user can act on: shown as one clear line, never as a traceback."""


class PackError(ValueError):
    """A problem the user can fix (bad name, unknown pack, malformed config)."""


class PackNotReady(PackError):
    """The pack exists but cannot be read: never built, or its files are damaged."""
