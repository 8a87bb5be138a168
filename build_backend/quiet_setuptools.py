"""The project's build backend: setuptools' own, without its notice on every editable install.

``prefect_webhooks.flows`` and ``prefect_webhooks.deployments`` are built from the top-level folders ``flows/`` and
``deployments/`` (``[tool.setuptools.package-dir]``), so setuptools installs the package in editable mode through an
import finder, and that strategy always ends with the notice "Editable installation. Please be careful with folders
in your working directory with the same name as your package". The folder it means is the package's own source,
which that finder maps: nothing can take precedence over it. Everything else (wheels, metadata, every other warning)
is setuptools' unchanged.
"""

from __future__ import annotations

import warnings
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403 - every hook setuptools defines, unchanged
from setuptools.warnings import InformationOnly


def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                   metadata_directory: str | None = None) -> str:
    """setuptools' ``build_editable`` without the notice about folders named like the package."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Editable installation", category=InformationOnly)
        return build_meta.build_editable(wheel_directory, config_settings, metadata_directory)
