"""Every ```python block of README.md and of the pages under docs/ runs as written (one test per distinct block).

A block repeated verbatim on another page (the README's quickstart on the Home page)
runs once, under the id of its first occurrence.

Each block runs in its own subprocess (``python -c``), from a scratch folder, with
this checkout first on ``PYTHONPATH``. Blocks too slow for the suite carry a
``<!-- doc-test small: OLD => NEW | ... -->`` comment right above the fence:
literal substitutions applied when ``JAXSUB_DOCS_SIZE=small`` (the default here);
``JAXSUB_DOCS_SIZE=as_written python -m pytest tests/test_docs.py`` runs every
block verbatim. ``<!-- doc-test skip: reason -->`` skips a block. See
``tests/_docblocks.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from _docblocks import ROOT, SIZE_ENV, all_blocks, doc_files, python_blocks

ALL_BLOCKS = all_blocks()
BLOCKS = list({(b.code, b.small, b.skip): b for b in ALL_BLOCKS[::-1]}.values())  # first occurrences
BLOCKS.sort(key=ALL_BLOCKS.index)
TIMEOUT_S = 300  # generous for a loaded 2-core machine; blocks should take < 20 s when idle


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block_runs(block, tmp_path):
    if block.skip:
        pytest.skip(block.skip)
    code = block.source()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("MPLBACKEND", "Agg")
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, (
        f"{block.id} ({os.environ.get(SIZE_ENV, 'small')} sizes) failed after {elapsed:.1f} s:\n"
        f"--- code ---\n{code}\n--- stderr (tail) ---\n{result.stderr[-4000:]}"
    )
    print(f"{block.id}: {elapsed:.1f} s")


def test_every_doc_page_is_collected():
    pages = {str(p.relative_to(ROOT)) for p in doc_files()}
    assert {"README.md", "docs/architecture.md", "docs/index.md", "docs/getting-started.md"} <= pages
    with_code = {str(b.path.relative_to(ROOT)) for b in ALL_BLOCKS}
    assert {"README.md", "docs/architecture.md", "docs/getting-started.md", "docs/index.md"} <= with_code
    assert any(page.startswith("docs/guides/") for page in with_code)


def test_directives_are_applied_and_checked(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- doc-test small: 1000 => 10 | range(5) => range(2) -->\n```python\nx = sum(range(5)) * 1000\n```\n\n"
        "<!-- doc-test skip: needs 8 devices -->\n```python\nraise SystemExit(1)\n```\n\n"
        "<!-- doc-test small: 7 => 8 -->\n```python\nprint(1)\n```\n"
        "```bash\necho not python\n```\n"
    )
    first, skipped, stale = python_blocks(page)
    assert first.source("small") == "x = sum(range(2)) * 10\n"
    assert first.source("as_written") == "x = sum(range(5)) * 1000\n"
    assert skipped.skip == "needs 8 devices"
    with pytest.raises(AssertionError, match="matches nothing"):
        stale.source("small")


# --------------------------------------------------------------------------- the performance page


def _snapshot(name, rows, **extra):
    record = {
        "benchmark": name,
        "title": f"{name} title",
        "quick": True,
        "commit": "0123456789abcdef",
        "date": "2026-01-01T00:00:00+00:00",
        "machine": {"processor": "x86_64", "cpu_count": 2, "jax": "0.10.2", "devices": ["TFRT_CPU_0"]},
        "load_average": {"before": [0.5, 0.5, 0.5], "after": [0.7, 0.6, 0.5]},
        "wall_s": 12.0,
        "rows": rows,
    }
    record.update(extra)
    return record


def test_report_tables_ratios_with_ranges(tmp_path):
    from benchmarks import report

    rows = [
        {
            "factor": "gauss",
            "mode": "single",
            "B": 64,
            "N": 1_000_000,
            "D": 10,
            "draws": 1,
            "eval_ratio": 45.5,
            "data_ratio": 20.0,
            "speedup": 4.0,
            "exact_times": [4.0, 6.0, 9.0],
            "racing_times": [2.0, 1.0, 1.0],
        }
    ]
    page = report.render({"discrete": _snapshot("discrete", rows)}, tmp_path, plots=False)
    # per-repeat ratios 2, 6, 9: median 6, range 2-9 (not the stored ratio of medians)
    assert "**6×** (2–9)" in page
    assert "commit `0123456789ab`" in page and "load average 0.5 → 0.7" in page and "2026-01-01 00:00:00 UTC" in page
    for family in report.FAMILIES:
        assert f"## {family.title}\n" in page
    assert "`coreference`: no snapshot yet" in page


def test_report_slugs_match_the_home_page_links():
    from benchmarks import report

    home = (ROOT / "docs" / "index.md").read_text()
    for family in report.FAMILIES:
        assert f"performance/index.md#{report.slug(family.title)}" in home


def test_performance_page_is_generated_from_the_committed_snapshots(tmp_path):
    from benchmarks import report

    folder = ROOT / "docs" / "performance"
    snapshots = report.load_snapshots(folder)
    if not snapshots:
        pytest.skip("no committed snapshot")
    expected = report.render(snapshots, tmp_path, plots=False)
    assert (folder / "index.md").read_text() == expected, "regenerate it: python -m benchmarks.report"
    for name in snapshots:
        for key in ("commit", "date", "machine", "load_average"):
            assert key in snapshots[name], (
                f"{name}.json lacks {key}: re-run python -m benchmarks --out docs/performance"
            )
