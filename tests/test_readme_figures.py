"""Every figure the README quotes from a benchmark is rendered from a committed result file
(docs/results/*.json) by benchmarks/readme_figures.py: the README must agree with those files."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figures():
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "benchmarks" / "readme_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_quotes_exactly_what_the_result_files_hold():
    readme = (ROOT / "README.md").read_text()
    blocks = [name for name in figures().RENDER if f"<!-- figures:{name} -->" in readme]
    assert blocks, "the README has no generated figures block"
    for name in blocks:
        assert (ROOT / "docs" / "results" / f"{name}.json").is_file(), f"{name}: no result file behind its block"
    assert figures().render(readme, ROOT / "docs" / "results") == readme, \
        "README figures differ from docs/results: run python benchmarks/readme_figures.py"


def test_a_changed_result_file_changes_the_readme(tmp_path):
    """The check can fail: one repeat of a committed file edited, and its block no longer matches."""
    mod = figures()
    readme = (ROOT / "README.md").read_text()
    name = next(n for n in mod.RENDER if f"<!-- figures:{n} -->" in readme)
    for f in (ROOT / "docs" / "results").glob("*.json"):
        (tmp_path / f.name).write_text(f.read_text())
    data = json.loads((tmp_path / f"{name}.json").read_text())
    data["load_avg_1_5_15"]["before"][0] += 10.0
    (tmp_path / f"{name}.json").write_text(json.dumps(data))
    assert mod.render(readme, tmp_path) != readme
