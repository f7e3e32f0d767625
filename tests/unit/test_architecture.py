"""The import rules of README.md#architecture, read from the source (every import, nested too).

A wrong import fails here with the module and the line: the pure core (metrics, stream,
detect) never reaches an edge or a client library, the stream core never reaches the
detector, only the edge packages talk to Kafka, HTTP or Prometheus, and no module grows
into a tangle (no import cycle between modules, none much over 400 lines).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "service"
EDGE_LIBRARIES = {"kafka", "fastapi", "uvicorn", "prometheus_client", "starlette"}
EDGES = {"broker", "http"}
"""The subpackages that may import the edge libraries."""
MAY_IMPORT: dict[str, set[str]] = {
    # subpackage: the parts of ``service`` it may import (top-level modules by name)
    "metrics": {"metrics", "errors"},
    "stream": {"stream", "metrics", "errors", "times"},
    "detect": {"detect", "stream", "metrics", "errors", "times"},
    "sim": {"sim", "errors", "times"},
    "offline": {"offline", "metrics", "stream", "errors", "times"},
    "mapping": {"mapping", "stream", "errors"},
    "replay": {"replay", "monitor", "stream", "offline", "mapping", "errors", "times"},
}
MAX_LINES = 400


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, nested ones included."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.level:
                raise AssertionError(f"{path}:{node.lineno}: use absolute imports")
            yield node.lineno, node.module
            for alias in node.names:  # from service.broker import compat
                yield node.lineno, f"{node.module}.{alias.name}"


def part_of(module: str) -> str | None:
    """``service.stream.join`` -> ``stream``; ``service.times`` -> ``times``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "service" and len(parts) > 1 else None


MODULES = dict(modules())


def test_the_package_has_the_subpackages_of_the_readme() -> None:
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert subpackages == {*MAY_IMPORT, *EDGES}
    readme = (PACKAGE.parent / "README.md").read_text()
    for name in subpackages:
        assert f"`service/{name}/`" in readme, name


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_the_edges_import_kafka_http_or_prometheus(name: str) -> None:
    if part_of(name) in EDGES:
        return
    for line, module in imports(MODULES[name]):
        assert module.split(".")[0] not in EDGE_LIBRARIES, f"{MODULES[name]}:{line}: {module}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if part_of(n) in MAY_IMPORT))
def test_core_packages_import_only_what_they_may(name: str) -> None:
    allowed = MAY_IMPORT[part_of(name) or ""]
    for line, module in imports(MODULES[name]):
        target = part_of(module)
        if target is not None and module in MODULES:
            assert target in allowed, f"{MODULES[name]}:{line}: {name} imports {module}"


def test_no_import_cycle_between_modules() -> None:
    graph = {
        name: {m for _, m in imports(path) if m in MODULES and m not in {name, "service"}}
        for name, path in MODULES.items()
    }
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_400_lines(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name]} has {lines} lines; split it by concern"


def test_the_rules_catch_a_forbidden_import(tmp_path: Path) -> None:
    """The checks above read real imports: a nested one and a from-import are both seen."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from service.detect import detector\n    import kafka.errors\n")
    found = [module for _, module in imports(bad)]
    assert "service.detect.detector" in found
    assert part_of("service.detect.detector") not in MAY_IMPORT["stream"]
    assert ["kafka", "errors"][0] in EDGE_LIBRARIES
