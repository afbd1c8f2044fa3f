"""Writes docs/reference.md, the API reference, from the package's docstrings:

    python docs/make_reference.py            # rewrite docs/reference.md
    python docs/make_reference.py --check    # exit 1 when the file is stale (CI)

Every name in `cuda_sharded_jit.__all__`, in that order, with its signature and docstring;
classes with their public methods and properties. No GPU and no numba needed.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

REFERENCE = Path(__file__).with_name("reference.md")


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__ or "(undocumented)")


# Dunder methods that are API: the interchange protocols consumers call (ShardView's DLPack).
_PROTOCOL_METHODS = ("__dlpack__", "__dlpack_device__")


def _members(cls):
    for name, value in vars(cls).items():
        if name.startswith("_") and name not in _PROTOCOL_METHODS:
            continue
        if isinstance(value, property):
            yield name, "property", value.fget
        elif isinstance(value, (classmethod, staticmethod)):
            yield name, "method", getattr(cls, name)  # bound: no `cls` in the signature
        elif inspect.isfunction(value):
            yield name, "method", value


# Public, but left out of __all__ (a star import would shadow the builtins): listed after reduce.
_NOT_STAR_EXPORTED = ("sum", "min", "max")
# Classes the library makes (by_devices, allocate, compile, ...): no constructor to show.
_MADE_BY_THE_LIBRARY = {"PlaceGroup", "ShardedArray", "ShardView", "CompiledKernel"}
# Members the algorithms use that are no part of the API.
_INTERNAL = {"Op.check_arity", "Op.identity"}


def _names(sharded) -> list[str]:
    names = list(sharded.__all__)
    at = names.index("reduce") + 1
    return names[:at] + list(_NOT_STAR_EXPORTED) + names[at:]


def render() -> str:
    import cuda_sharded_jit as sharded

    lines = ["# API reference", "",
             "Generated from the docstrings by `python docs/make_reference.py`; "
             "`import cuda_sharded_jit as sharded`.", ""]
    for name in _names(sharded):
        obj = getattr(sharded, name)
        if inspect.isclass(obj):
            made = name in _MADE_BY_THE_LIBRARY
            lines += [f"## `sharded.{name}`", "", f"class `{name}{'' if made else _signature(obj)}`", "",
                      _doc(obj), ""]
            for member, kind, function in _members(obj):
                if f"{name}.{member}" in _INTERNAL:
                    continue
                head = f"`{name}.{member}`" if kind == "property" else f"`{name}.{member}{_signature(function)}`"
                lines += [f"### {head}", "", _doc(function), ""]
        elif callable(obj):
            lines += [f"## `sharded.{name}{_signature(obj)}`", "", _doc(obj), ""]
        elif inspect.ismodule(obj):
            lines += [f"## `sharded.{name}`", "", _doc(obj), ""]
        else:
            lines += [f"## `sharded.{name}`", "", f"`{obj!r}`", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not REFERENCE.exists() or REFERENCE.read_text() != text:
            print(f"{REFERENCE} is stale: run python docs/make_reference.py", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text)
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
