"""How a command ends, and its exit code: the one list of them (the README repeats it).

| code | name                | meaning                                                          |
|------|---------------------|------------------------------------------------------------------|
| 0    | EXIT_OK             | everything that ran passed                                       |
| 1    | EXIT_CHECK_FAILED   | a check ran and failed                                           |
| 2    | EXIT_USAGE          | bad input: arguments, config files, paths, permissions           |
| 3    | EXIT_UNSUPPORTED    | this machine cannot run that: no GPU, wrong SM, no nvcc, a       |
|      |                     | missing package                                                  |
| 4    | EXIT_SYSTEM_FAILED  | the server or the machine failed while the command ran: a GSM8K  |
|      |                     | server that died, stalled or kept failing, a compiler that       |
|      |                     | failed, a disk that filled                                       |
| 130  | EXIT_INTERRUPTED    | interrupted (Ctrl-C, SIGINT or SIGTERM)                          |

Codes 2-4 and 130 print one line on stderr (`nopebench: error: ...`), never a traceback. Each
has its exception class below; the command line maps the class to the code.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_UNSUPPORTED = 3
EXIT_SYSTEM_FAILED = 4
EXIT_INTERRUPTED = 130


class NopebenchError(Exception):
    """A command stopped for a reason its message states in one line; `exit_code` says which."""

    exit_code = EXIT_USAGE


class UsageError(NopebenchError):
    """Bad input the user can fix (arguments, configs, paths, permissions): exit 2."""

    exit_code = EXIT_USAGE


class UnsupportedError(NopebenchError):
    """The requested implementation or check cannot run on this machine: exit 3.

    `nopebench run` records a step that raises it as skipped, with the message as the reason.
    """

    exit_code = EXIT_UNSUPPORTED


class SystemFailedError(NopebenchError):
    """The server or the machine failed while the command ran, not the input: exit 4."""

    exit_code = EXIT_SYSTEM_FAILED
