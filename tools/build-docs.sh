#!/usr/bin/env bash
# Build the documentation (docs/, Sphinx with MyST and numpydoc) into build/docs/html.
#
#   bash tools/build-docs.sh          (what `make docs` runs)
#
# Fails on any warning (-W, all of them reported first: --keep-going), including every
# reference that does not resolve (-n: a link between pages, a heading anchor, a
# cross-reference in a docstring) and a docstring that does not parse. Always a fresh
# build (-E): Sphinx does not notice a changed docstring, and an unchanged page would
# not repeat its warnings. Then checks that the API reference (docs/api.rst) documents
# every public name: everything in hpckpt.__all__, and the public classes and
# functions (and their public methods) of the modules it documents.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PY:-$repo/.venv/bin/python}
out=${HPCKPT_DOCS_OUT:-$repo/build/docs}

rm -rf "$out/html"
"$python" -m sphinx -b html -E -n -W --keep-going -q -d "$out/doctrees" "$repo/docs" "$out/html"

"$python" - "$out/html/objects.inv" "$repo/docs/api.rst" <<'PY'
"""Every public name of the documented modules is in the built inventory."""
import functools
import importlib
import inspect
import re
import sys
import zlib

inventory_path, api_path = sys.argv[1:]
with open(inventory_path, "rb") as stream:
    for _ in range(4):  # the header lines: format, project, version, compression
        stream.readline()
    text = zlib.decompress(stream.read()).decode()
documented = {line.split(" ", 1)[0] for line in text.splitlines() if line.startswith("hpckpt")}

import hpckpt  # noqa: E402


def methods(cls):
    """The public methods and properties a class defines itself (not its data attributes)."""
    kinds = (staticmethod, classmethod, property, functools.cached_property)
    return [name for name, value in vars(cls).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, kinds))]


# A name exported by hpckpt is documented as hpckpt.NAME, wherever it is defined.
exported = {id(getattr(hpckpt, name)): f"hpckpt.{name}" for name in hpckpt.__all__}
wanted = set(exported.values())
# The modules documented whole: `.. automodule:: NAME` with a bare `:members:` option.
modules = [name for name, options in re.findall(r"^\.\. automodule:: (\S+)\n((?:   .*\n)*)",
                                                open(api_path).read(), flags=re.MULTILINE)
           if re.search(r"^   :members:\s*$", options, flags=re.MULTILINE)]
classes = [getattr(hpckpt, name) for name in hpckpt.__all__ if inspect.isclass(getattr(hpckpt, name))]
for module_name in modules:
    module = importlib.import_module(module_name)
    public = getattr(module, "__all__", None) or [name for name in vars(module) if not name.startswith("_")]
    for name in public:
        value = getattr(module, name)
        if getattr(value, "__module__", None) != module_name:
            continue  # imported from elsewhere: documented where it is defined
        if inspect.isclass(value) or inspect.isfunction(value):
            wanted.add(exported.get(id(value), f"{module_name}.{name}"))
        if inspect.isclass(value):
            classes.append(value)
for cls in classes:
    where = exported.get(id(cls), f"{cls.__module__}.{cls.__qualname__}")
    wanted.update(f"{where}.{member}" for member in methods(cls))

missing = sorted(wanted - documented)
if missing:
    sys.exit("build-docs: public names missing from the API reference (docs/api.rst):\n  "
             + "\n  ".join(missing))
print(f"build-docs: {len(documented)} names documented, none missing; open {inventory_path[:-11]}index.html")
PY
