"""Errors raised by the template registry.

Error tree::

    TemplateError                      base of every template error
    ├── UnknownTemplateError (KeyError)        no template with that name
    ├── TemplateParamError (ValueError)        a parameter is unknown, of the wrong type or out of range
    ├── TemplateRenderError                    the output folder cannot be written
    └── TemplateValidationError                rendered code fails to compile, import or pass its checks
"""

from __future__ import annotations


class TemplateError(Exception):
    """Base class of every error raised by :mod:`templates`."""


class UnknownTemplateError(TemplateError, KeyError):
    """No template has the requested name.

    Attributes:
        name: The name that was asked for.
        available: Names of the templates that exist.
    """

    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.available = available
        super().__init__(f"unknown template {name!r}; available: {', '.join(available)}")

    def __str__(self) -> str:  # KeyError would otherwise show the repr of the message
        return str(self.args[0])


class TemplateParamError(TemplateError, ValueError):
    """A template parameter is unknown, has the wrong type or lies outside its range.

    Attributes:
        template: Template name.
        param: Parameter name.
    """

    def __init__(self, template: str, param: str, message: str) -> None:
        self.template = template
        self.param = param
        super().__init__(f"template {template!r}, parameter {param!r}: {message}")


class TemplateRenderError(TemplateError):
    """The rendered template could not be written (e.g. the output folder is not empty)."""


class TemplateValidationError(TemplateError):
    """Rendered template code failed validation.

    Attributes:
        step: Which step failed: ``compile``, ``import``, ``data`` or ``checks``.
        detail: The failure output (compiler message, traceback tail or failed checks).
    """

    def __init__(self, step: str, detail: str) -> None:
        self.step = step
        self.detail = detail
        super().__init__(f"validation failed at {step}: {detail}")
