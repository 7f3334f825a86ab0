"""Build step: compiles servesim's simulation core with Cython when it can, as an optional speed-up.

The modules in :data:`COMPILED` stay plain Python source, the only code there is: Cython compiles them
unchanged, with Python's semantics kept (no type inference, annotations not used as C types, Python's
``**``), so a compiled engine gives the same results bit for bit (tests/test_compiled_engine.py). The one
declaration the build adds is generated, not written: the classes in :data:`EXTENSION_TYPES` keep their
state in ``__slots__``, and each becomes an extension type with one Python-object field per slot (a
``.pxd`` written from the source's ``__slots__`` at build time), read at a fixed offset in its own methods
instead of looked up by name; every value is still a Python object. Where
Cython or a C compiler is missing, or ``SERVESIM_PURE_PYTHON=1`` is set, the install is pure Python and
nothing else changes. Each built module's source hash, size and mtime go into the package's
``_compiled.json``; :mod:`servesim.compiled` imports a module's source instead of its compiled copy once
the source differs (an edited or mutated file runs as written, no rebuild needed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: The modules compiled: the engine's hot path (per step and per run of steps) and the step time it calls
#: per step (the roofline's and the drafter's terms).
COMPILED = [
    "servesim.heap",
    "servesim.roofline",
    "servesim.speculation.costs",
    "servesim.engine.arrival_source",
    "servesim.engine.block_manager",
    "servesim.engine.core",
    "servesim.engine.plain_decoding",
    "servesim.engine.run_records",
    "servesim.engine.speculative_decoding",
    "servesim.engine.step_rows",
]
#: Cython settings that keep Python's semantics (the compiled engine must equal the interpreted one).
DIRECTIVES = {"language_level": 3, "infer_types": False, "annotation_typing": False, "cpow": True,
              "binding": True}
#: The classes compiled as extension types (attributes stored in the object, read by offset in their own
#: methods): each keeps its state in ``__slots__``, and the build declares exactly those slots as attributes
#: of Python type (``cdef public object``), so values keep Python's semantics (:func:`_declarations`).
EXTENSION_TYPES = {
    "servesim.engine.core": ("Engine",),
    "servesim.engine.plain_decoding": ("PlainDecoding",),
    "servesim.engine.speculative_decoding": ("SpeculativeDecoding", "DecoderTimeline"),
    "servesim.engine.block_manager": ("BlockManager", "CachedBlock", "QueueSlot", "CacheHit", "OwnHit"),
    "servesim.engine.run_records": ("RunRecords",),
}
CYTHON_BUILD = HERE / "build" / "cython"  # Cython's generated C files (its build_dir, relative to the clone)
DECLARATIONS = CYTHON_BUILD / "declarations"  # the generated .pxd files (Cython's include path)
MANIFEST = "_compiled.json"  # servesim.compiled.MANIFEST's file name
#: servesim.shipped.SHIPPED_FOLDERS and PACKAGE_COPY (setup.py does not import the package it builds): the
#: data folders of the clone a wheel carries inside the package
SHIPPED_FOLDERS = ("hardware", "workloads/acceptance", "experiments/validation")
PACKAGE_COPY = "_shipped"


#: Each compiled module's source record (:func:`_source_record`) taken just before Cython translates it.
SOURCES_TRANSLATED: dict[str, dict] = {}


def _source(name: str) -> Path:
    return HERE.joinpath(*name.split(".")).with_suffix(".py")


def _source_record(path: Path) -> dict:
    """What servesim.compiled checks a built module's source against: SHA-256, size (bytes), mtime (ns)."""
    stat = path.stat()
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns}


class BuildCompiled(build_ext):
    """build_ext on all CPUs that records each built module's source (hash, size, mtime: the package's
    ``_compiled.json``)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        super().run()
        package = Path(self.get_ext_fullpath("servesim.heap")).parent
        built = {ext.name: SOURCES_TRANSLATED.get(ext.name) or _source_record(_source(ext.name))
                 for ext in self.extensions if Path(self.get_ext_fullpath(ext.name)).is_file()}
        (package / MANIFEST).write_text(json.dumps(built, indent=1, sort_keys=True) + "\n", encoding="utf-8")


class BuildWithData(build_py):
    """build_py that copies the clone's shipped data folders into the built package (``servesim/_shipped``),
    so that a wheel or a plain ``pip install .`` has the cards, acceptance profiles and validation cases;
    an editable install reads the clone's own folders and copies nothing."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "servesim" / PACKAGE_COPY
        shutil.rmtree(target, ignore_errors=True)
        for folder in SHIPPED_FOLDERS:
            shutil.copytree(HERE / folder, target / folder,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


def _slots_of(source: Path, class_name: str) -> list[str]:
    """The names in class ``class_name``'s ``__slots__`` in ``source``: its last assignment in the class body
    (as Python takes it), a literal tuple or list of strings, or one string (a single slot).

    Raises:
        ValueError: the class has no such ``__slots__`` (missing, computed, or not strings), named with the
            file, the class and :data:`EXTENSION_TYPES`.
    """
    import ast

    expected = (f"{source}: class {class_name} (setup.py EXTENSION_TYPES) needs __slots__ as a literal tuple "
                "of attribute names")
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            values = [item.value for item in node.body if isinstance(item, ast.Assign) and len(item.targets) == 1
                      and isinstance(item.targets[0], ast.Name) and item.targets[0].id == "__slots__"]
            if not values:
                break
            try:
                slots = ast.literal_eval(values[-1])
            except ValueError:
                raise ValueError(f"{expected} (its __slots__ is computed)") from None
            if isinstance(slots, str):
                slots = (slots,)
            if not isinstance(slots, (tuple, list)) or not all(isinstance(name, str) for name in slots):
                break
            return list(slots)
    raise ValueError(expected)


def _declarations() -> None:
    """Write, for each module in :data:`EXTENSION_TYPES`, the ``.pxd`` that makes its listed classes extension
    types: one ``cdef public object`` attribute per slot (``cdef object __weakref__`` for that slot), so the
    source's ``__slots__`` is the one list of a class's attributes, compiled or interpreted."""
    for module in COMPILED:
        if module not in EXTENSION_TYPES:  # an earlier build's declarations of a module no longer listed
            _write_if_changed(module, DECLARATIONS.joinpath(*module.split(".")).with_suffix(".pxd"), None)
    for module, classes in EXTENSION_TYPES.items():
        lines = []
        for class_name in classes:
            slots = _slots_of(_source(module), class_name)
            lines.append(f"cdef class {class_name}:")
            lines += [f"    cdef public object {name}" for name in slots if name != "__weakref__"]
            if "__weakref__" in slots:
                lines.append("    cdef object __weakref__")
        _write_if_changed(module, DECLARATIONS.joinpath(*module.split(".")).with_suffix(".pxd"),
                          "# generated by setup.py from the source's __slots__\n" + "\n".join(lines) + "\n")


def _write_if_changed(module: str, target: Path, text: str | None) -> None:
    """Write (or, for None, remove) ``module``'s declarations; when they change, remove the C file Cython
    generated from the module before, which its dependency check would otherwise keep (it does not know of
    a declarations file that did not exist at the last translation)."""
    old = target.read_text(encoding="utf-8") if target.is_file() else None
    if old == text:
        return
    CYTHON_BUILD.joinpath(*module.split(".")).with_suffix(".c").unlink(missing_ok=True)
    if text is None:
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def _extensions() -> list[Extension]:
    # the rule of servesim.compiled.pure_python_requested (setup.py does not import the package it builds)
    if os.environ.get("SERVESIM_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:  # no Cython in the build environment: a pure-Python install
        return []
    # each source as Cython reads it, recorded first: a file edited while the build runs is then recorded as
    # the older version, so that the guard sees the edit and imports the source
    SOURCES_TRANSLATED.update({name: _source_record(_source(name)) for name in COMPILED})
    # optional: a module that fails to compile (no C compiler) is left interpreted, the install goes on
    extensions = [Extension(name, [str(_source(name).relative_to(HERE))], optional=True) for name in COMPILED]
    _declarations()
    return cythonize(extensions, compiler_directives=DIRECTIVES, build_dir=str(CYTHON_BUILD.relative_to(HERE)),
                     quiet=True, include_path=[str(DECLARATIONS)])


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildCompiled, "build_py": BuildWithData})
