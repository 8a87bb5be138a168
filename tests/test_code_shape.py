"""The shape of the package: small modules, each one concept, that a newcomer reads in one sitting."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ``flows/`` and ``deployments/`` are installed as ``prefect_webhooks.flows`` and ``prefect_webhooks.deployments``.
PACKAGE_FOLDERS = ("prefect_webhooks", "flows", "deployments")
MAX_LINES = 420
# A run of this many identical lines (blank lines and lone brackets not counted) is one step written twice.
REPEATED_RUN = 6
# The stages of the data flow, lowest first (see prefect_webhooks/__init__.py). A module imports only from its own
# stage or a lower one; stages on one line do not import one another.
STAGE_ORDER = (
    ("utilities",),
    ("settings",),
    ("messages",),
    ("signing",),
    ("blocks",),
    ("store",),
    ("client", "inbound", "delivery", "audiences", "deletions"),
    ("flows", "deployments", "console"),
    ("serving",),
    ("demo",),
    ("commands",),
    ("cli",),
)
# The mechanisms inside the two largest stages, lowest first (each sub-package's ``__init__`` says what it takes in
# and hands on). A module imports only from its own mechanism or a lower one, so no two mechanisms form a cycle.
MECHANISM_ORDER = {
    "store": ("schema", "log", "dedupe", "engine", "figures", "endpoints", "queue", "upkeep"),
    "delivery": ("sending", "endpoints", "pacing", "batches"),
}
# The only modules directly under prefect_webhooks/: the package's entry points. ``__init__`` (the public names),
# ``settings`` (every stage reads it; users set it), ``cli`` (the console script). ``blocks`` is a folder, the
# entry point Prefect's collections registry imports.
TOP_LEVEL_MODULES = {"__init__.py", "settings.py", "cli.py"}
# The sync and async forms of one public method share their signature, as Prefect's own ``save``/``asave`` do.
TWIN_SIGNATURES = {("prefect_webhooks/blocks/destination.py", "arotate_secret", "rotate_secret")}


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
    assert "prefect_webhooks/delivery/batches/claims.py" in modules  # the walk reaches subpackages
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


def module_name(path: str) -> str:
    """The import name of a module of the package tree (``flows/deliver.py`` → ``prefect_webhooks.flows.deliver``)."""
    parts = list(Path(path).with_suffix("").parts)
    if parts[0] != "prefect_webhooks":
        parts.insert(0, "prefect_webhooks")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def internal_imports() -> dict[str, set[str]]:
    """Module → the package's modules it imports (deferred imports inside functions included)."""
    names = {module_name(path) for path in package_modules()}
    graph: dict[str, set[str]] = {}
    for path, lines in package_modules().items():
        found = set()
        for node in ast.walk(ast.parse("\n".join(lines))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                # The most specific module of the package the import names.
                while target and target not in names:
                    target = target.rpartition(".")[0]
                if target:
                    found.add(target)
                    break
        graph[module_name(path)] = found - {module_name(path)}
    return graph


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_module_sits_directly_under_the_package_but_its_entry_points() -> None:
    loose = {path.name for path in (ROOT / "prefect_webhooks").glob("*.py")} - TOP_LEVEL_MODULES
    assert loose == set(), f"modules outside a stage folder: {sorted(loose)}"
    folders = {path.parent.name for path in (ROOT / "prefect_webhooks").glob("*/__init__.py")}
    staged = {stage for level in STAGE_ORDER for stage in level}
    assert folders <= staged, f"folders missing from STAGE_ORDER: {sorted(folders - staged)}"


def test_no_import_runs_up_the_stages() -> None:
    level = {stage: index for index, stages in enumerate(STAGE_ORDER) for stage in stages}
    upward = []
    for module, imported in internal_imports().items():
        if module == "prefect_webhooks":
            continue  # the package's public names, imported on first use, sit above every stage
        for target in imported:
            source_stage, target_stage = stage_of(module), stage_of(target)
            if source_stage != target_stage and level[target_stage] >= level[source_stage]:
                upward.append(f"{module} -> {target}")
    assert "prefect_webhooks.delivery.batches.claims" in internal_imports()
    assert sorted(upward) == []


def test_no_import_cycles() -> None:
    graph = internal_imports()
    cycles = []
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join(path[path.index(target):] + [module, target]) if target in path
                              else f"{module} -> {target}")
            elif target not in state:
                visit(target, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert cycles == []


def mechanism_of(module: str) -> tuple[str, str] | None:
    """(stage, mechanism) of a module inside store/ or delivery/; None for any other, and for the stages' own
    ``__init__``, which gathers the public names of every mechanism."""
    parts = module.split(".")
    return (parts[1], parts[2]) if len(parts) > 3 and parts[1] in MECHANISM_ORDER else None


def test_every_module_of_store_and_delivery_sits_in_a_listed_mechanism() -> None:
    for stage, mechanisms in MECHANISM_ORDER.items():
        loose = {path.name for path in (ROOT / "prefect_webhooks" / stage).glob("*.py")} - {"__init__.py"}
        assert loose == set(), f"{stage}/ modules outside a mechanism folder: {sorted(loose)}"
        folders = {path.parent.name for path in (ROOT / "prefect_webhooks" / stage).glob("*/__init__.py")}
        assert folders == set(mechanisms), f"{stage}/ folders and MECHANISM_ORDER differ"


def test_each_mechanism_lists_its_modules() -> None:
    # Its __init__'s docstring names every module once, one line each (``- ``name``: ...``), in reading order.
    for stage, mechanisms in MECHANISM_ORDER.items():
        for mechanism in mechanisms:
            folder = ROOT / "prefect_webhooks" / stage / mechanism
            docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
            listed = re.findall(r"^- ``(\w+)``", docstring, re.M)
            modules = {path.stem for path in folder.glob("*.py")} - {"__init__"}
            assert sorted(listed) == sorted(modules), f"{stage}/{mechanism}/__init__.py lists {listed}"


def test_no_import_runs_up_the_mechanisms() -> None:
    upward = []
    for module, imported in internal_imports().items():
        source = mechanism_of(module)
        for target in imported:
            aimed = mechanism_of(target)
            if source and aimed and source[0] == aimed[0]:
                order = MECHANISM_ORDER[source[0]]
                if order.index(aimed[1]) > order.index(source[1]):
                    upward.append(f"{module} -> {target}")
    assert "prefect_webhooks.store.queue.outbox" in internal_imports()
    assert sorted(upward) == []


def test_no_cycle_between_mechanisms() -> None:
    arrows: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
    for module, imported in internal_imports().items():
        source = mechanism_of(module)
        for target in imported:
            aimed = mechanism_of(target)
            if source and aimed and aimed != source:
                arrows[source].add(aimed)
    assert arrows[("store", "queue")]  # the graph is there to walk
    cycles = []

    def walk(mechanism: tuple[str, str], path: list[tuple[str, str]]) -> None:
        for target in sorted(arrows[mechanism]):
            if target in path:
                cycles.append(" -> ".join("/".join(step) for step in [*path[path.index(target):], mechanism, target]))
            else:
                walk(target, [*path, mechanism])

    for mechanism in sorted(arrows):
        walk(mechanism, [])
    assert cycles == []
