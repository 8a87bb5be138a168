"""Public names of a package imported on first use (PEP 562), so importing a package costs only what is used.

The ingest API's stage re-exports ``create_app`` (FastAPI), the serving stage the delivery worker (Prefect): a process
that needs one small module of a stage must not pay for the stage's heaviest imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose public names live in the modules ``exports`` names.

    Args:
        package: The package's ``__name__``.
        exports: Public name → the module that defines it.

    Returns:
        Functions to assign to the package's ``__getattr__`` and ``__dir__``.
    """
    namespace = import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(exports[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        # What a user of the package may use, as ``__all__`` lists it, not the helpers the package imported.
        return sorted(set(namespace.get("__all__", ())) | set(exports))

    return __getattr__, __dir__
