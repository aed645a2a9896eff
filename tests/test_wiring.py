"""Issue 36: no component's attribute is assigned after construction by another module.

A component gets what it depends on in its constructor, or through a method of its own that says
what it means (``KafkaApis.serve_transactions``, ``ConnectionHandle.authenticated``); an assignment
such as ``self.apis.transactions = self`` in another module hides that dependency from both
readers and the type checker. This scans every module of ``pipeline/`` for assignments to an
attribute of an attribute (``a.b.c = ...``) and allows only the listed ones, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"

ALLOWED = {
    # A component's own counters, kept in a stats object it made.
    ("persist/persister.py", "self.stats"), ("requests/handler.py", "self.stats"),
    # Readiness is metrics.py's own class; the endpoint that made it updates it.
    ("observe/metrics.py", "self.readiness"),
    # DynamicCluster is the view LeadershipService keeps current (pipeline.cluster.membership's docstring).
    ("cluster/service.py", "self.cluster"),
    # A channel drives the ConnectionState it was built with (the sans-I/O half of the connection).
    ("network/channel.py", "self.state"),
}


def _assigned_chains(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, the owner expression, the whole target) of each ``owner.attr = ...`` whose owner is itself
    an attribute (``self.apis``, ``endpoint.readiness``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(element, ast.Attribute) and isinstance(element.value, ast.Attribute):
                    found.append((element.lineno, ast.unparse(element.value), ast.unparse(element)))
    return found


def test_no_attribute_of_another_component_is_assigned():
    offenders = []
    for path in sorted(PIPELINE.rglob("*.py")):
        relative = path.relative_to(PIPELINE).as_posix()
        for line, owner, target in _assigned_chains(ast.parse(path.read_text(), str(path))):
            if (relative, owner) not in ALLOWED:
                offenders.append(f"pipeline/{relative}:{line}: {target} = ...")
    assert not offenders, ("give the component a constructor argument or a method of its own instead of:\n"
                           + "\n".join(offenders))


def test_the_scan_finds_what_it_forbids():
    assert [t for _, _, t in _assigned_chains(ast.parse("self.apis.transactions = self\nx.y = 1\n"))] == [
        "self.apis.transactions"]
