"""The README's quickstart runs as written: whole on a GPU; its compile step (the part that
needs no GPU) everywhere, after the main job's install alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _quickstart() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert blocks, "the README has no python block"
    return blocks[0]


def _compile_part(code: str) -> str:
    """The imports, the operator and everything from the compile step on."""
    lines = code.splitlines()
    imports = [line for line in lines if line.startswith("import ")]
    start = lines.index("@sharded.op")
    operator = lines[start:start + 3]
    compile_from = next(index for index, line in enumerate(lines) if line.startswith("k = sharded.compile"))
    return "\n".join(imports + operator + lines[compile_from:]) + "\n"


def test_quickstart_compile_step_needs_no_gpu(capsys):
    exec(compile(_compile_part(_quickstart()), "README quickstart", "exec"), {})  # noqa: S102
    module, size, _ = capsys.readouterr().out.split()
    assert module == "transform_o4_i4_4" and int(size) > 0


@pytest.mark.gpu
def test_quickstart_runs_whole(capsys):
    exec(compile(_quickstart(), "README quickstart", "exec"), {})  # noqa: S102
    assert "transform_o4_i4_4" in capsys.readouterr().out
