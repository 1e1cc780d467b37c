"""Sphinx configuration of hpckpt's documentation (built by tools/build-docs.sh, `make docs`).

The pages are Markdown (MyST) except api.rst, whose reference is generated from the
docstrings (autodoc, numpydoc style). The build is offline: no intersphinx, so
references to names outside hpckpt (numpy, mpi4py, the standard library) are not
checked (``nitpick_ignore_regex``), while every reference to an hpckpt name must resolve.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path

from sphinx.util import logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hpckpt, installed or not
import hpckpt

project = "hpckpt"
author = "the hpckpt authors"
copyright = "the hpckpt authors"
version = release = hpckpt.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
# `[text](page.md#a-section)` between pages: headings get anchors (GitHub's slugs).
myst_heading_anchors = 4

html_theme = "alabaster"
html_title = f"hpckpt {release}"

# The API reference (api.rst): autodoc reads the docstrings, numpydoc renders their
# sections; members are listed by autodoc (:members:), not again by numpydoc.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autosummary_generate = False
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# Every reference must resolve (-n): those to hpckpt's names are checked; names from
# the standard library and other packages have no inventory offline, so are not.
nitpicky = True
_FOREIGN = ("pathlib", "os", "collections", "typing", "types", "enum", "signal", "datetime",
            "numpy", "np", "mpi4py", "MPI", "torch", "pytest", "_pytest")
nitpick_ignore_regex = [(r"py:.*", rf"(?:{'|'.join(_FOREIGN)})\.[\w.]+")]
# pathlib's Path, unqualified in the signature that dataclasses generate (StepEntry's).
nitpick_ignore = [("py:class", "Path")]

# Classes that hpckpt makes and hands to a program, which never constructs them: shown
# without their constructor's signature (which names internal types).
HANDED_OUT = {
    "hpckpt.engines.background.SaveHandle",
    "hpckpt.engines.base.SaveStats",
    "hpckpt.messages.comm.LoggedComm",
}


def _factory_defaults(app, what, name, obj, options, signature, return_annotation):
    """A dataclass field's ``default_factory`` shown as its call (``dict()``), not as
    ``<factory>``, which the signature parser cannot read.
    """
    if what != "class" or not signature or "<factory>" not in signature:
        return None
    for made in (f.default_factory for f in dataclasses.fields(obj)
                 if f.default_factory is not dataclasses.MISSING):
        signature = signature.replace("<factory>", f"{made.__name__}()", 1)
    return signature, return_annotation


def _hidden_signatures(app, what, name, obj, options, signature, return_annotation):
    """No constructor signature for the classes in HANDED_OUT, nor for protocols (a class
    that has their methods is one; nothing constructs them).
    """
    if name in HANDED_OUT or (what == "class" and getattr(obj, "_is_protocol", False)):
        return "", None
    return None


def _skip_tuple_fields(app, what, name, obj, skip, options):
    """Leave out a NamedTuple's fields, whose docstrings only say "Alias for field number N"
    (the class docstring describes them).
    """
    if what == "class" and (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    return None


def _numpydoc_warnings_to_sphinx():
    """Pass numpydoc's complaints about a docstring it cannot parse (an unknown section
    such as "Paramters"), which it reports with ``warnings.warn`` where ``-W`` does not
    see them, to Sphinx's log: they fail the build like any other warning.
    """
    log = logging.getLogger("numpydoc")
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if "numpydoc" in filename:
            log.warning("%s", message)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.filterwarnings("always", module=r"numpydoc\.")
    warnings.showwarning = show


def setup(app):
    """Sphinx's hook: connect the handlers above."""
    _numpydoc_warnings_to_sphinx()
    app.connect("autodoc-process-signature", _factory_defaults)
    app.connect("autodoc-process-signature", _hidden_signatures)
    app.connect("autodoc-skip-member", _skip_tuple_fields)
