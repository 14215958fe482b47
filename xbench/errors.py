"""Errors a user can act on.

Every `XbenchError` message is one line that says what to change; the CLI prints it as
`error: <message>` and exits non-zero, never with a traceback.
"""


class XbenchError(Exception):
    """A problem the user can fix; the message says how."""


class SpecError(XbenchError):
    """The experiment spec (TOML file or command-line override) is invalid."""


class BackendError(XbenchError):
    """A backend is unknown, not installed, or cannot provide what was asked."""
