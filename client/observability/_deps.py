"""The optional libraries of ``gradwire.observability``, imported only when asked for."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require", "EXTRA"]

#: The extra that installs them: ``pip install 'gradwire[observability]'``.
EXTRA = "observability"
_PACKAGES = {"prometheus_client": "prometheus-client", "opentelemetry": "opentelemetry-api"}


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` for gradwire's ``what`` (metrics, tracing).

    Raises:
        ImportError: it is not installed; the message names the extra that installs it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = _PACKAGES.get(module.split(".")[0], module)
        raise ImportError(
            f"gradwire's {what} need {package}, which is not installed: "
            f"pip install 'gradwire[{EXTRA}]'"
        ) from exc
