"""The one exception type the command line turns into a one-line message."""


class NMTError(Exception):
    """A user-facing error: bad input, missing files, unknown names. No traceback is shown."""


def first_line(err: BaseException) -> str:
    """What a one-line message quotes of a library's exception: its message's first line, or
    its type's name where it has none."""
    return str(err).splitlines()[0] if str(err) else type(err).__name__
