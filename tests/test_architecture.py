"""The package's shape, read from its source with `ast` (nothing is imported): no import circle, a torch-free
runtime layer, and each model kind named only by its record in families.py and its own stage modules."""

from __future__ import annotations

import ast
from pathlib import Path

from vibevoice_onnx.families import FAMILIES, KINDS, family, load

SOURCE = Path(__file__).resolve().parents[1] / "src" / "vibevoice_onnx"
PACKAGE = SOURCE.name
HEAVY = {"torch", "transformers", "onnx"}  # the export extra; onnxruntime is the runtime's own
RUNTIME_LAYER = ("runtime", "generation")

# Where a kind string may stand besides families.py and tests. A kind's own stage modules are named after it in
# each layer (export/realtime.py, verify/tts15b.py, runtime/asr_streaming.py ...): the stems of the modules its
# record names, and the realtime fixed-shape profile's (export/fixed.py, verify/realtime_fixed.py,
# runtime/fixed.py), whose code is realtime's alone.
PROFILE_STEMS = {"fixed", "realtime_fixed"}
# Files that keep a literal for another reason, and which literals:
ALLOWED = {
    # ASR-Streaming's released sizes are called "1.5b" and "7b": a variant, not the kind.
    "checkpoints/configs.py": {"1.5b"},
    # The demo makes and speaks the smallest kind by name; make-checkpoint --variant offers ASR-Streaming's sizes.
    "cli.py": {"realtime", "1.5b"},
    # serve's "asr" is its model list's task type (tts or asr, OpenAI's split of the routes), not the kind.
    "serve/app.py": {"asr"}, "serve/models.py": {"asr"}, "serve/transcriptions.py": {"asr"}, "serve/wyoming.py": {"asr"},
}


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(tree: ast.Module, module_level_only: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module: all of them, or those that run when it is imported (not inside a
    function); never those under `if TYPE_CHECKING`."""
    found, pending = [], list(tree.body)
    while pending:
        node = pending.pop()
        if _is_type_checking(node):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not (module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))):
            pending.extend(ast.iter_child_nodes(node))
    return found


def imported_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known) -> list[str]:
    """The dotted names an import statement depends on (a relative one resolved against `module`): in
    `from X import a`, X.a where that is a module, else X (the packages above a module load first anyway)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target for alias in node.names]


def import_graph(module_level_only: bool = False) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> the package's modules it imports, module -> the outside packages it imports)."""
    known = modules()
    inside, outside = {}, {}
    for module, path in known.items():
        nodes = imports(ast.parse(path.read_text()), module_level_only)
        names = [n for node in nodes for n in imported_names(module, path.name == "__init__.py", node, known)]
        inside[module] = {n for n in names if n in known and n != module}
        outside[module] = {n.split(".")[0] for n in names if n.split(".")[0] != PACKAGE}
    return inside, outside


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules along it (the first repeated at the end), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], path[len(path):] = "open", [node]
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph()[0])
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def reachable(graph: dict[str, set[str]], roots: list[str]) -> set[str]:
    """The modules `roots` import, directly or not (themselves included)."""
    reached, pending = set(), list(roots)
    while pending:
        module = pending.pop()
        if module not in reached:
            reached.add(module)
            pending.extend(graph[module])
    return reached


def test_the_runtime_layer_imports_no_torch_transformers_or_onnx_at_module_level():
    inside, outside = import_graph(module_level_only=True)
    roots = [m for m in inside if m.split(".")[1:2] and m.split(".")[1] in RUNTIME_LAYER]
    reached = reachable(inside, roots)
    heavy = {m: sorted(outside[m] & HEAVY) for m in sorted(reached) if outside[m] & HEAVY}
    assert roots and not heavy, f"imported when the runtime is: {heavy}"


def test_the_torch_free_builder_imports_no_torch_or_transformers_at_module_level():
    """writer/ and the build command's module (export/build.py) run in the base install: onnx is theirs, torch and
    transformers are only the traced path's, imported when it is taken."""
    inside, outside = import_graph(module_level_only=True)
    roots = [m for m in inside if m.split(".")[1:2] == ["writer"] or m.endswith(".export.build")]
    reached = reachable(inside, roots)
    heavy = {m: sorted(outside[m] & {"torch", "transformers"}) for m in sorted(reached) if outside[m] & {"torch", "transformers"}}
    assert len(roots) > 3 and not heavy, f"imported when the builder is: {heavy}"


def own_stems() -> set[str]:
    named = [getattr(f, field) for f in FAMILIES
             for field in ("exporter", "writer", "gates", "runtime", "reference", "torch_backend")]
    return {name.partition(":")[0].rsplit(".", 1)[-1] for name in named if name} | PROFILE_STEMS


def kind_literals(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and node.value in KINDS}


def test_kind_strings_stand_only_in_families_and_the_kinds_own_modules():
    stems = own_stems()
    misplaced = {}
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE).as_posix()
        if relative == "families.py" or path.stem in stems:
            continue
        stray = kind_literals(path) - ALLOWED.get(relative, set())
        if stray:
            misplaced[relative] = sorted(stray)
    assert not misplaced, f"kind strings outside families.py and the kinds' own modules: {misplaced}"


def test_the_allow_list_names_real_files_that_need_it():
    stale = [name for name in ALLOWED if not (SOURCE / name).is_file() or not kind_literals(SOURCE / name)]
    assert not stale, f"allow-list entries with no kind string left (remove them): {stale}"


def test_every_name_a_record_gives_loads():
    """Each "module:attribute" (or module) a record names exists: a typo fails here, not at a user's build."""
    named = ("hub_config", "layout", "variants", "preprocessor", "added_tokens", "reference", "to_transformers",
             "torch_backend", "exporter", "writer", "policy", "gates", "runtime")
    for record in FAMILIES:
        for name in filter(None, (getattr(record, field) for field in named)):
            assert load(name) is not None, (record.name, name)


def test_each_kind_is_recognised_from_its_own_hub_config():
    from vibevoice_onnx.checkpoints.configs import detect_kind, full_config

    assert all(detect_kind(full_config(kind)) == kind for kind in KINDS)
    assert family("asr-streaming").shard_count(tied_head=False) == 8
