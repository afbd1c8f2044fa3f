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


def _members(cls):
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            yield name, "property", value.fget
        elif isinstance(value, (classmethod, staticmethod)):
            yield name, "method", getattr(cls, name)  # bound: no `cls` in the signature
        elif inspect.isfunction(value):
            yield name, "method", value


def render() -> str:
    import cuda_sharded_jit as sharded

    lines = ["# API reference", "",
             "Generated from the docstrings by `python docs/make_reference.py`; "
             "`import cuda_sharded_jit as sharded`.", ""]
    for name in sharded.__all__:
        obj = getattr(sharded, name)
        if inspect.isclass(obj):
            lines += [f"## `sharded.{name}`", "", f"class `{name}{_signature(obj)}`", "", _doc(obj), ""]
            for member, kind, function in _members(obj):
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
