"""The exceptions moetune raises on bad input.

Every `MoetuneError` is a user or data problem: the CLI prints its message on
one line as ``Error: <message>`` and exits 1, never with a traceback.
"""

import signal


class MoetuneError(Exception):
    """A problem with the user's input or data; printed as one line, exit 1."""


class InvalidMappingsError(MoetuneError):
    """moe_mappings.yaml (or a user mappings file) is malformed or fails its schema."""


class ConfigSourceError(MoetuneError):
    """The model's config.json could not be found, fetched or parsed."""


class UnknownArchitectureError(MoetuneError):
    """No mappings entry matches the config's architecture or model_type."""


class MissingFieldError(MoetuneError):
    """A required MoE parameter resolved on none of its paths."""


class ShardingError(MoetuneError):
    """A TP/EP split that does not divide the experts or the intermediate size."""


class TuneError(MoetuneError):
    """A tuning run cannot start or cannot finish (bad search space, no GPU, ...)."""


class Terminated(BaseException):
    """Raised in the main thread by the CLI's SIGTERM/SIGHUP handler (like KeyboardInterrupt
    for SIGINT); `signum` is the signal.

    A BaseException, so that no ``except Exception`` on the way swallows it.
    """

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = int(signum)


class Interrupted(BaseException):
    """A run stopped by SIGINT or SIGTERM, after its workers are gone and its results saved.

    The CLI prints `message` as the one line on stderr and exits ``128 + signum``
    (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.message = message

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class MoetuneWarning(UserWarning):
    """Something the user should know that stops nothing (a skipped store line, say).

    The CLI prints it as one line, ``Warning: <message>``.
    """
