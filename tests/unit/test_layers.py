"""hpckpt's modules import only their own layer and the layers below (docs/design.md).

Every import counts, including those inside functions. A new module must be given a
layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hpckpt"
LAYERS = [  # lowest first; a module's layer is the longest prefix listed
    (
        "base",
        [
            "hpckpt._activity", "hpckpt._checks", "hpckpt._hooks", "hpckpt._gc", "hpckpt.errors",
            "hpckpt.checksum",
            "hpckpt._comm", "hpckpt.progress", "hpckpt.schedule", "hpckpt.slurm",
        ],
    ),
    ("model", ["hpckpt.model"]),
    ("buffers and storage", ["hpckpt.buffers", "hpckpt.storage"]),
    ("protocols and levels", ["hpckpt.messages", "hpckpt.protocols", "hpckpt.levels", "hpckpt.recovery"]),
    ("engines", ["hpckpt.engines", "hpckpt.options"]),
    (
        "facade",
        [
            "hpckpt", "hpckpt.checkpointer", "hpckpt.catalog", "hpckpt.convert", "hpckpt.testing",
            "hpckpt.attachment", "hpckpt.restoring", "hpckpt.stateful",
        ],
    ),
    ("command line and examples", ["hpckpt.cli", "hpckpt.__main__", "hpckpt.relaunch", "hpckpt.examples"]),
]


def module_name(path: Path) -> str:
    parts = ("hpckpt", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    matches = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} has no layer in tests/unit/test_layers.py"
    return max(matches)[1]


def imports_of(path: Path) -> set[str]:
    """The hpckpt modules ``path`` imports (``from . import x`` counts as module ``x``)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "hpckpt")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "hpckpt":
                continue
            found.add(target)
            for alias in node.names:  # a submodule imported by name
                candidate = f"{target}.{alias.name}"
                relative = Path(*candidate.split(".")[1:])
                if (PACKAGE / relative).is_dir() or (PACKAGE / relative).with_suffix(".py").exists():
                    found.add(candidate)
    return found


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        for imported in sorted(imports_of(path)):
            if layer_of(imported) > layer_of(module):
                upward.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) imports {imported} "
                    f"({LAYERS[layer_of(imported)][0]})"
                )
    assert not upward, "\n".join(upward)


def test_the_library_reaches_fault_injection_only_through_the_hook():
    users = sorted(
        module_name(path)
        for path in PACKAGE.rglob("*.py")
        if any(name.startswith("hpckpt.testing") for name in imports_of(path))
    )
    assert users == ["hpckpt", "hpckpt.examples.heat", "hpckpt.examples.train"], users
