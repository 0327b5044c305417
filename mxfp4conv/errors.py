"""User-facing errors.

Anything wrong with the input or the request is raised as an ``Mxfp4convError`` whose
message is one self-contained paragraph (which file, which tensor, what is wrong, what
would fix it). The CLI prints it on stderr and exits with status 1, without a traceback.
"""


class Mxfp4convError(Exception):
    """A problem with the user's input or request (exit status 1)."""


class CheckpointError(Mxfp4convError):
    """A checkpoint (source or converted) is malformed or unsupported."""


class OracleError(Mxfp4convError):
    """The requested target cannot be served (unknown arch, impossible tp, refused backend)."""


class LayoutError(Mxfp4convError, ValueError):
    """A tensor's shape or dtype is not accepted by a layout transform."""


class RuntimeInputError(Mxfp4convError, ValueError):
    """Bad arguments to the serve-time runtime (manifest mismatch, wrong shapes/dtypes)."""
