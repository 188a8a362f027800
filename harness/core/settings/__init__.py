"""The typed configuration layer: the value types of every option and ``HIL_*`` variable
(values.py), the registry of the variables (variables.py: those declared there, and those a
kind declares, registered by the kind registry), and the one function that reads a
raw string for a named setting (``parse``), raising a one-line ``SettingError`` that names it.

The pytest options (harness/plugin/options.py) and the ``hil`` commands (harness/cli.py) declare
their values through it, so a value is checked the same way wherever it is given. No pytest
here: the ``hil`` commands use it too."""

from harness.core.settings.values import (
    MAX_LOGPROBS,
    TYPES,
    SettingError,
    ValueType,
    choice,
    parse,
    value_type,
    where,
)
from harness.core.settings.variables import (
    BY_OPTION,
    BY_VARIABLE,
    DECLARED_BY,
    VARIABLES,
    Variable,
    env_problems,
    env_value,
    register_variables,
)

__all__ = [
    "BY_OPTION", "BY_VARIABLE", "DECLARED_BY", "MAX_LOGPROBS", "TYPES", "VARIABLES",
    "SettingError", "ValueType", "Variable", "choice", "env_problems", "env_value", "parse",
    "register_variables", "value_type", "where",
]
