"""Errors the kforge client raises. Every one names what was asked, what went
wrong and, where there is one, what to do about it."""


class KforgeError(Exception):
    """Base of every kforge client error."""


class KforgeUnavailable(KforgeError):
    """The server did not answer (or kept answering UNAVAILABLE or
    RESOURCE_EXHAUSTED) through every attempt."""


class KforgeBadAnswer(KforgeError):
    """A server or bundle answered with something other than what was asked
    (another kernel, an empty cubin, a damaged file)."""


class KforgeNotFound(KforgeError):
    """The source does not hold what was asked (server NOT_FOUND, a kernel or
    manifest missing from a bundle, no manifest variant fits a shape)."""


class KforgeRpcError(KforgeError):
    """The server refused a request with a status that retrying cannot fix
    (INVALID_ARGUMENT, FAILED_PRECONDITION, INTERNAL, ...)."""

    def __init__(self, message, code_name, details):
        super().__init__(message)
        self.code_name = code_name  # e.g. "INVALID_ARGUMENT"
        self.details = details      # the server's status message


class KforgeInvalidArgument(KforgeError, ValueError):
    """A bad argument, as kforge's C++ rules judge it (absl
    INVALID_ARGUMENT or OUT_OF_RANGE): a shape, stride, pointer, spec field
    or device the kernels do not support. The message names the field, the
    value and what is supported. Also a ValueError."""

    def __init__(self, message, code=3):
        super().__init__(message)
        self.code = code  # the absl status code
