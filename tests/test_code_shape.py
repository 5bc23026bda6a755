"""The code stays readable a screen at a time: no function in the package or the benchmark scripts
runs past 50 lines (a longer one is split where its parts can be named)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 50


def long_functions(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_runs_past_50_lines():
    assert long_functions(ROOT / "batchlab") + long_functions(ROOT / "benchmarks") == []


def test_the_check_sees_a_long_function(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * LIMIT)
    assert long_functions(tmp_path) == ["m.py:1 f (51 lines)"]
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * (LIMIT - 1))
    assert long_functions(tmp_path) == []
