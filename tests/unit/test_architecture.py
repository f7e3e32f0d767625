"""The import rules of README.md#architecture, read from the source (every import, nested too).

A wrong import fails here with the module and the line: every part of the package (each
subpackage and top-level module) has its row of what it may import; the pure core
(metrics, stream, detect, core) never reaches an edge or a client library, the stream core
never reaches the detector, only the edge packages talk to Kafka, HTTP or Prometheus,
nothing outside the stream core touches the join's per-partition state, and no module
grows into a tangle (no import cycle between modules, none over 400 lines but the named
hot ones).
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
ANY = "anything but the commands"
MAY_IMPORT: dict[str, set[str] | str] = {
    # every part of ``service`` (subpackage or top-level module): the parts it may import
    "metrics": {"metrics", "errors"},
    "audit": {"audit", "errors"},
    "stream": {"stream", "audit", "metrics", "errors", "times"},
    "detect": {"detect", "stream", "metrics", "errors", "times"},
    "sim": {"sim", "audit", "metrics", "errors", "times"},
    "offline": {"offline", "metrics", "stream", "errors", "times"},
    "mapping": {"mapping", "stream", "errors"},
    "core": {"core", "detect", "stream", "audit", "metrics", "errors", "times"},
    "replay": {
        "replay",
        "core",
        "mapping",
        "offline",
        "stream",
        "audit",
        "metrics",
        "errors",
        "times",
    },
    "broker": ANY,
    "http": ANY,
    "commands": "anything",
    # the top-level modules
    "errors": {"errors"},
    "times": {"times", "errors"},
    "setting_values": {"setting_values", "metrics", "errors", "times"},
    "config": {
        "config",
        "setting_values",
        "audit",
        "core",
        "detect",
        "stream",
        "metrics",
        "errors",
        "times",
    },
    "__main__": {"commands"},
}
SUBPACKAGES = {
    "metrics",
    "audit",
    "stream",
    "detect",
    "sim",
    "offline",
    "mapping",
    "core",
    "replay",
}
SUBPACKAGES |= EDGES | {"commands"}
MAX_LINES = 400
"""Past this a module is usually two concerns: split it by concern, not by length."""
HOT_MODULES = {
    # module: why it is one module past MAX_LINES (README.md#architecture)
    "service.stream.join": "the per-record loop and the per-partition state it alone acts on",
}
MAX_HOT_LINES = 800
"""The named hot modules' limit: one concern still, never a grab bag."""


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
    assert subpackages == SUBPACKAGES
    readme = (PACKAGE.parent / "README.md").read_text()
    for name in subpackages:
        assert f"`service/{name}/`" in readme, name
    for name in set(MAY_IMPORT) - SUBPACKAGES:
        assert f"`{name}.py`" in readme, name


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_is_in_the_rules(name: str) -> None:
    """A new subpackage or top-level module needs its row here and in the README."""
    assert name == "service" or part_of(name) in MAY_IMPORT, (
        f"{MODULES[name]}: add it to MAY_IMPORT"
    )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_the_edges_import_kafka_http_or_prometheus(name: str) -> None:
    if part_of(name) in EDGES:
        return
    for line, module in imports(MODULES[name]):
        assert module.split(".")[0] not in EDGE_LIBRARIES, f"{MODULES[name]}:{line}: {module}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if part_of(n) in MAY_IMPORT))
def test_every_part_imports_only_what_it_may(name: str) -> None:
    allowed = MAY_IMPORT[part_of(name) or ""]
    if allowed == "anything":
        return
    for line, module in imports(MODULES[name]):
        target = part_of(module)
        if target is None or module not in MODULES:
            continue
        if allowed == ANY:
            assert target != "commands", f"{MODULES[name]}:{line}: {name} imports {module}"
        else:
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
def test_no_module_is_over_400_lines_but_the_named_hot_ones(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    limit = MAX_HOT_LINES if name in HOT_MODULES else MAX_LINES
    assert lines <= limit, f"{MODULES[name]} has {lines} lines; split it by concern"


def test_the_hot_modules_are_named_in_the_readme() -> None:
    readme = (PACKAGE.parent / "README.md").read_text()
    for name in HOT_MODULES:
        assert name.replace("service.", "").replace(".", "/") + ".py" in readme, name


JOIN_STATE = ("service.stream.join", "service.stream.join_state", "service.stream.watermark")
"""The modules of the join's per-partition state and its watermark."""
JOIN_NAMES_OUTSIDE = {"JoinConfig", "NEVER"}
"""What of them the rest of the package may import: the join's settings, the time before all."""
SHARED_NAMES = {
    # attribute names of the join's state that other objects outside the stream core have
    # too, with another meaning (a setting, a record's partition, a file's close, a batch's
    # pending lines, a window's labels, a gauge's value, a Kafka batch's next offset, ...)
    "config", "partition", "close", "take", "advance", "latest", "labels", "value", "counts",
    "update", "windows", "pending", "next_offset", "finish", "closed_through_ms",
    "early_through_ms",
}  # fmt: skip


def _members(path: Path, classes: set[str]) -> set[str]:
    """The methods of ``classes`` in ``path`` and the attributes they set on ``self``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef):
                    found.add(item.name)
                elif (
                    isinstance(item, ast.Attribute)
                    and isinstance(item.ctx, ast.Store)
                    and isinstance(item.value, ast.Name)
                    and item.value.id == "self"
                ):
                    found.add(item.attr)
    return found


def join_internals(package: Path) -> set[str]:
    """The names that only the stream core may use: every member of ``PartitionStream``
    and ``PartitionWatermark`` (and ``Pipeline.streams``, the table of them), less what
    ``Pipeline`` offers the edges under the same name and the names in SHARED_NAMES."""
    stream = package / "stream"
    state = _members(stream / "join.py", {"PartitionStream"}) | _members(
        stream / "watermark.py", {"PartitionWatermark"}
    )
    door = {n for n in _members(stream / "pipeline.py", {"Pipeline"}) if not n.startswith("_")}
    return (state | {"streams"}) - (door - {"streams"}) - SHARED_NAMES - {"__init__"}


def touches_join_internals(path: Path, internals: set[str]) -> Iterator[str]:
    """Where a module reads or writes the join's state: an attribute of it by name, or an
    import of the state's classes."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in internals:
            yield f"{path}:{node.lineno}: .{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module in JOIN_STATE:
            for alias in node.names:
                if alias.name not in JOIN_NAMES_OUTSIDE:
                    yield f"{path}:{node.lineno}: imports {alias.name} from {node.module}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in JOIN_STATE:
                    yield f"{path}:{node.lineno}: imports {alias.name}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if part_of(n) != "stream"))
def test_only_the_stream_core_touches_the_joins_state(name: str) -> None:
    """The edges go through ``Pipeline``'s methods (take over, set a backlog, hand over,
    drop, commit plans): nothing outside ``service/stream/`` reads or writes a
    ``PartitionStream`` or its watermark (``README.md#architecture``)."""
    found = list(touches_join_internals(MODULES[name], join_internals(PACKAGE)))
    assert not found, "outside the stream core, use Pipeline's methods:\n" + "\n".join(found)


def test_the_join_rule_sees_what_the_edge_used_to_do(tmp_path: Path) -> None:
    """What the Kafka edge did before the core had a door is caught, name by name."""
    internals = join_internals(PACKAGE)
    bad = tmp_path / "edge.py"
    bad.write_text(
        "from service.stream.join import PartitionStream\n"
        "def f(pipeline, p, counted):\n"
        "    stream = pipeline.streams[p]\n"
        "    stream.counted_from = counted\n"
        "    stream.watermark.set_backlog(0, True)\n"
        "    return stream.orphans, stream.held\n"
    )
    found = "\n".join(touches_join_internals(bad, internals))
    for what in ("PartitionStream", ".streams", ".counted_from", ".watermark", ".orphans"):
        assert what in found, what
    assert {"counted_from", "watermark", "streams", "last_seen", "_backlog"} <= internals
    assert not {"take_over", "set_backlog", "partitions"} & internals  # the door's


def test_the_rules_catch_a_forbidden_import(tmp_path: Path) -> None:
    """The checks above read real imports: a nested one and a from-import are both seen."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from service.detect import detector\n    import kafka.errors\n")
    found = [module for _, module in imports(bad)]
    assert "service.detect.detector" in found
    assert "detect" not in MAY_IMPORT["stream"]
    assert ["kafka", "errors"][0] in EDGE_LIBRARIES
