"""The two ways a command ends badly, and their exit codes.

`UsageError` is bad input (arguments, config files, missing data, a GPU that cannot run the
requested path): one line, exit 2, nothing written. A check that ran and failed is exit 1.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input the user can fix; the message is printed as one line."""


class UnsupportedError(UsageError):
    """The requested implementation or check cannot run on this machine."""
