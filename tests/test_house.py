"""The house's shape that import-linter's contracts do not state: no module imports itself back through others (a circle,
type-checking imports included). A package's ``__init__`` is its folder's front door, not a module of the circle."""

from __future__ import annotations

import grimp


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports directly, fdattack's own, without the packages' ``__init__`` modules."""
    graph = grimp.build_graph("fdattack")
    modules = set(graph.modules)
    packages = {m for m in modules if any(other.startswith(m + ".") for other in modules)}
    return {m: set(graph.find_modules_directly_imported_by(m)) - packages for m in modules - packages}


def find_circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``edges`` (its modules in import order, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for imported in sorted(edges.get(module, ())):
            if imported in on_path:
                return [*path[path.index(imported) :], imported]
            if imported not in done:
                circle = visit(imported)
                if circle:
                    return circle
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    for module in sorted(edges):
        if module not in done:
            circle = visit(module)
            if circle:
                return circle
    return None


def test_the_circle_finder_finds_one() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None


def test_no_module_imports_itself_back() -> None:
    """Issue 59: ``evaluation.membership`` and ``evaluation.scoring`` imported each other (the candidates now live in
    ``evaluation.candidates``), as did ``matrix.comparisons`` and ``matrix.outputs`` (a cell's result now lives in
    ``matrix.cell_result``)."""
    circle = find_circle(_import_graph())
    assert circle is None, " -> ".join(circle or [])
