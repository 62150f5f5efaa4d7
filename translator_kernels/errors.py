"""The kernel library's one error for bad input to a host entry point.

`KernelInputError` is raised for arguments a kernel cannot take (dtype, shape, device, an
unknown op in a program, a tile that does not fit). Its message names the entry point, what
was wrong and what to do. It subclasses ValueError on purpose: callers written against the
library's earlier bare ValueErrors, and users who catch ValueError, keep working; code that
means "a kernel refused its input" catches KernelInputError.

The translator does not import this module to classify its own errors: it turns a
KernelInputError raised while it runs a kernel into its own TranslatorError subclasses.
"""


class KernelInputError(ValueError):
    """A kernel library entry point refused its arguments; the message says why and the fix."""
