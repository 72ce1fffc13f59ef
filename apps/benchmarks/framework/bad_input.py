"""The one error of ``make benchmark``'s user, in a module of its own so that listing and refusing import nothing
heavy (the protocol module pulls in SciPy and pandas: seconds before a one-line answer)."""


class BadInput(ValueError):
    """A benchmark cannot start on what the user named (protocol, version, data root, model).

    The command line prints the message alone: the user mistyped something, and a traceback would bury it.
    """
