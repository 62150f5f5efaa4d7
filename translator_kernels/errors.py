"""The kernel library's one error for bad input to a host entry point.

`KernelInputError` is raised for arguments a kernel cannot take: dtype, shape, device, an
unknown op in a per-element program, a tile that does not fit, an arch without support. Its
message names the entry point, what was wrong and what to do.

It subclasses ValueError on purpose. Callers written against the library's earlier bare
ValueErrors, and users who catch ValueError around a kernel call, keep working. Code that
means "a kernel refused its input" catches KernelInputError and leaves other ValueErrors (a bug)
alone.

The translator never lets a kernel see input its support checks refused. When a kernel raises
at run time anyway, translate() reports it as the cause of a failed verification.
"""


class KernelInputError(ValueError):
    """A kernel library entry point refused its arguments; the message says why and gives the fix."""


class KernelCacheError(PermissionError):
    """The folder generated kernel sources are written to cannot be used (a file in the way, no
    permission, a full disk, a folder not ours). A library built on this one may name a subclass of
    its own in `raised_as` (the translator: a TranslatorError), which `cache_error` then makes."""

    raised_as: type | None = None


def cache_error(message: str) -> KernelCacheError:
    return (KernelCacheError.raised_as or KernelCacheError)(message)
