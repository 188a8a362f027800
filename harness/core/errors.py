"""What goes wrong with an engine, as exceptions every stage can catch without knowing the engine's host."""

from __future__ import annotations


class EngineError(RuntimeError):
    """An engine failed; the message says which, why, and ends with its log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        full = (
            message
            if not log_tail
            else f"{message}\n--- engine log tail ---\n{log_tail}"
        )
        super().__init__(full)


class EngineStartError(EngineError):
    """The engine process did not come up."""


class EngineRefused(EngineStartError):
    """The engine raised during start (it refused its configuration); its process was alive."""

    def __init__(self, message: str, log_tail: str = "", error_type: str = "") -> None:
        super().__init__(message, log_tail)
        self.error_type = error_type  # the exception's class name, as the engine raised it

    @property
    def defect(self) -> bool:
        """A programming error raised at start (a TypeError in a configurator): a defect of
        the stack, never a refusal of the configuration a test may expect."""
        return self.error_type in PROGRAMMING_ERRORS


class EngineStartDefect(EngineStartError):
    """A programming error raised at start where a refusal was allowed: a defect to report."""


# Exceptions no configuration check raises: code that is broken, whatever it was given.
PROGRAMMING_ERRORS = frozenset({
    "TypeError", "AttributeError", "NameError", "UnboundLocalError", "KeyError", "IndexError",
    "ImportError", "ModuleNotFoundError", "AssertionError", "ZeroDivisionError",
    "RecursionError", "SyntaxError"})


class EngineCrashed(EngineError):
    """The engine process died during a call."""


class EngineTimeout(EngineError):
    """The engine gave no answer in time and was killed."""


class EngineRequestError(EngineError):
    """The engine refused or failed one call but is still alive."""


class DeviceMismatch(EngineError):
    """The engine came up, but not on the leased device as its kind asked (its kind's
    ``verify_device``: a Spyre engine that opened another card, say)."""
