"""The package's one error type (and its output-failure kind)."""

__all__ = ["PlanError", "OutputError"]


class PlanError(ValueError):
    """A model, wrapping, setting or file commplan cannot plan with; the message is one line naming
    the file or option, the field and the fix. Control characters that reach a message from the
    input (a newline in a name, an escape sequence) are shown escaped, so it stays one line."""

    def __init__(self, msg=""):
        if isinstance(msg, str) and not msg.isprintable():
            msg = "".join(c if c.isprintable() else repr(c)[1:-1] for c in msg)
        super().__init__(msg)


class OutputError(PlanError):
    """Writing a file or stdout failed (full disk, closed pipe, I/O error): the message names the
    path and the system's reason. The CLI exits 1 for these, 2 for bad input."""
