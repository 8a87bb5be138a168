"""The shape of the package: small modules, each one concept, that a newcomer reads in one sitting."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ``flows/`` and ``deployments/`` are installed as ``prefect_webhooks.flows`` and ``prefect_webhooks.deployments``.
PACKAGE_FOLDERS = ("prefect_webhooks", "flows", "deployments")
MAX_LINES = 420
# A run of this many identical lines (blank lines and lone brackets not counted) is one step written twice.
REPEATED_RUN = 6
# The sync and async forms of one public method share their signature, as Prefect's own ``save``/``asave`` do.
TWIN_SIGNATURES = {("prefect_webhooks/blocks.py", "arotate_secret", "rotate_secret")}


def package_modules() -> dict[str, list[str]]:
    modules = {}
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            modules[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8").splitlines()
    return modules


def signature_lines(name: str, methods: list[str]) -> list[int]:
    """The line numbers (from 1) of the signature lines of the named methods in a module."""
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    found = []
    for number, line in enumerate(lines, start=1):
        if any(line.strip().startswith((f"def {method}(", f"async def {method}(")) for method in methods):
            found += range(number, number + REPEATED_RUN + 1)
    return found


def test_no_module_is_longer_than_the_limit() -> None:
    modules = package_modules()
    assert "prefect_webhooks/delivery/claims.py" in modules  # the walk reaches subpackages
    offenders = {name: len(lines) for name, lines in modules.items() if len(lines) > MAX_LINES}
    assert offenders == {}, f"modules over {MAX_LINES} lines: {offenders}"


def test_no_two_places_share_a_run_of_identical_lines() -> None:
    places: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name, lines in package_modules().items():
        meaningful = [(number, line.strip()) for number, line in enumerate(lines, start=1)
                      if line.strip() not in ("", ")", "]", "}", "),", "],", "},", '"""')]
        for start in range(len(meaningful) - REPEATED_RUN + 1):
            window = tuple(text for _, text in meaningful[start:start + REPEATED_RUN])
            places[window].append(f"{name}:{meaningful[start][0]}")
    twins = {f"{name}:{line}" for name, *methods in TWIN_SIGNATURES for line in signature_lines(name, methods)}
    repeated = {window[0]: found for window, found in places.items() if len(set(found) - twins) > 1}
    assert repeated == {}, f"runs of {REPEATED_RUN} identical lines in more than one place: {repeated}"


def test_every_subpackage_is_in_pyprojects_package_list() -> None:
    # The wheel is built from a hand-kept list (two folders are mapped into the namespace); a subpackage left out
    # installs a package that fails on import. tests/test_packaging.py checks the built wheel itself.
    # Read with a pattern: tomllib is not in Python 3.10's standard library.
    packages = re.search(r"^packages = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S)
    assert packages
    listed = set(re.findall(r'"([\w.]+)"', packages[1]))
    found = {".".join(("prefect_webhooks", *path.parent.relative_to(ROOT / "prefect_webhooks").parts))
             for path in (ROOT / "prefect_webhooks").rglob("__init__.py")}
    assert "prefect_webhooks.delivery" in found
    assert sorted(found - listed) == []
