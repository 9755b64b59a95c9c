"""The layers of src/opmap, lowest first: a module imports only from its own layer or below, and no import
cycle exists between modules. Lazy imports inside functions count (a layer that reaches upward lazily still
reaches upward); imports under ``if TYPE_CHECKING:`` do not (annotations only).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Lowest first. A module belongs to the first entry whose prefix it matches (a package covers its modules).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leaves", ("opmap", "opmap.errors", "opmap.formats", "opmap.precision", "opmap.ops", "opmap.timing", "opmap.tags",
                "opmap.validate", "opmap.safeio", "opmap.geometry", "opmap.record")),
    ("graph", ("opmap.graph",)),
    ("costs", ("opmap.costs",)),
    ("hardware", ("opmap.hardware",)),  # the device description: a leaf but for precision and ops
    ("roofline", ("opmap.roofline",)),  # the one time model
    ("predict", ("opmap.predict",)),
    ("capture", ("opmap.capture",)),
    ("workloads", ("opmap.workloads",)),
    ("mapping", ("opmap.mapping",)),  # fusion, tilers, kernels; sharding and collectives later
    ("calibrate", ("opmap.calibrate",)),  # times the families of capture and costs
    ("analyze", ("opmap.analyze", "opmap.assumptions")),  # the pipeline and what it assumes
    ("phases", ("opmap.phases",)),  # runtime, prefill / decode / train figures built on the pipeline
    ("measure", ("opmap.measure",)),  # real runs joined to predictions
    ("api", ("opmap.api",)),  # the facade every command and explorer steps a model through
    ("serve", ("opmap.serve",)),  # serving simulator (the fit matrix runs it: below explore)
    ("engines", ("opmap.engines",)),  # engine presets: sizing rules over a priced replica, an engine policy out
    ("explore", ("opmap.explore",)),  # plans, sweeps, the fit matrix
    ("bench", ("opmap.bench",)),  # load against a real endpoint (its --predict runs serve)
    ("store", ("opmap.store",)),  # run store (to come)
    ("report", ("opmap.report",)),
    ("cli", ("opmap.cli",)),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: set[str], annotations: bool = False) -> set[str]:
    """The opmap modules ``path`` imports (``from opmap.x import y`` names opmap.x.y when y is a module), at module
    level and inside functions; those under ``if TYPE_CHECKING:`` too when ``annotations``."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not annotations:
            for n in node.orelse:
                visit(n)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "opmap")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "opmap":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return out


def _graph(annotations: bool = False) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in (SRC / "opmap").rglob("*.py")}
    return {m: _imports(p, set(files), annotations) - {m} for m, p in files.items()}


def test_every_module_has_a_layer_and_no_import_reaches_upward():
    bad = []
    for mod, deps in sorted(_graph().items()):
        lm = _layer(mod)
        for d in sorted(deps):
            if _layer(d) > lm:
                bad.append(f"{mod} ({LAYERS[lm][0]}) imports {d} ({LAYERS[_layer(d)][0]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def _cycles(g: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d in g and not state.get(d):
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(g):
        if not state.get(m):
            visit(m, [m])
    return cycles


def test_no_import_cycle():
    """No cycle among the modules of src/opmap: imports at module level, inside functions, and under ``if
    TYPE_CHECKING:`` (a circle of annotations is still a circle: mapping.sharding and the two modules split out of
    it, layout_collectives and sharded_memory, imported each other so; their shared types now live below all
    three, in mapping.shard_types)."""
    cycles = _cycles(_graph(annotations=True))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_check_sees_a_circle_through_a_function_and_type_checking(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from opmap.b import x\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from opmap.a import f\n")
    mods = {"opmap.a", "opmap.b"}
    g = {f"opmap.{n}": _imports(tmp_path / f"{n}.py", mods, annotations=True) for n in "ab"}
    assert _cycles(g) == ["opmap.a -> opmap.b -> opmap.a"]
    assert _imports(tmp_path / "b.py", mods) == set()  # the layering check leaves annotations out


def test_the_check_catches_an_upward_import(tmp_path):
    """The walker sees lazy imports and ignores TYPE_CHECKING ones."""
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from opmap.cli import main\n"
                 "def f():\n    from opmap.report.sheet import si\n")
    assert _imports(f, {"opmap.report.sheet"}) == {"opmap.report.sheet"}
    assert _layer("opmap.report.sheet") > _layer("opmap.graph")


def test_no_two_test_files_share_a_basename():
    """pytest imports test files without packages (rootdir-relative basenames): two test_x.py in two folders make
    the whole suite's collection fail (it did twice: serve's and hardware's test_spec.py, engines' and costs'
    test_rules.py)."""
    tests = Path(__file__).resolve().parent
    names: dict[str, list[str]] = {}
    for p in tests.rglob("test_*.py"):
        names.setdefault(p.name, []).append(str(p.relative_to(tests)))
    assert not {k: v for k, v in names.items() if len(v) > 1}
