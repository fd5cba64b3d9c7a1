"""The one exception type the command line turns into a one-line message."""


class NMTError(Exception):
    """A user-facing error: bad input, missing files, unknown names. No traceback is shown."""
