"""Every public name is documented with an example, and docs/reference.md is current."""

import importlib.util
import inspect
from pathlib import Path

import cuda_sharded_jit as sharded

ROOT = Path(__file__).resolve().parent.parent


def test_public_names_have_docstrings_with_examples():
    missing = []
    for name in sharded.__all__:
        obj = getattr(sharded, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        if ">>>" not in (obj.__doc__ or ""):
            missing.append(name)
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if member.startswith("_"):
                    continue
                function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if callable(function) and not (function.__doc__ or "").strip():
                    missing.append(f"{name}.{member}")
    assert not missing, f"documentation missing (or no >>> example) for: {missing}"


def test_reference_is_current():
    spec = importlib.util.spec_from_file_location("make_reference", ROOT / "docs" / "make_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "docs/reference.md is stale: run python docs/make_reference.py"
