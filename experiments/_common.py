"""Helpers shared by the experiments: report writer, plots, progress bars, JSON."""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Report", "progress", "savefig", "stamp_report", "to_jsonable", "markdown_table"]


def to_jsonable(obj: Any) -> Any:
    """Convert NumPy/JAX scalars and arrays (recursively) into JSON-able Python objects."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return to_jsonable(np.asarray(obj).tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def progress(iterable: Iterable | None = None, **kwargs):
    """A tqdm progress bar (``tqdm.auto``); pass ``total=`` for manual updates."""
    from tqdm.auto import tqdm

    kwargs.setdefault("leave", False)
    return tqdm(iterable, **kwargs)


def savefig(fig, out_dir: Path, name: str) -> str:
    """Save a matplotlib figure as ``out_dir/name`` (PNG, 120 dpi), close it, return the file name."""
    path = Path(out_dir) / name
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name


def markdown_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """Format rows as a GitHub markdown table; floats get 4 significant digits."""

    def fmt(v):
        if isinstance(v, (float, np.floating)):
            return f"{v:.4g}"
        return str(v)

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


class Report:
    """Accumulates a markdown report and writes it to ``out_dir/report.md``.

    Examples
    --------
    >>> rep = Report("Racing on synthetic rewards", out_dir)
    >>> rep.text("We reproduce Figure 1 of Chen & Ghahramani (2016).")
    >>> rep.table(rows, ["delta", "error rate"])
    >>> rep.figure(savefig(fig, out_dir, "error.png"), "Error rate vs delta")
    >>> rep.write()
    """

    def __init__(self, title: str, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.parts: list[str] = [f"# {title}", ""]

    def heading(self, text: str, level: int = 2) -> None:
        self.parts += ["#" * level + " " + text, ""]

    def text(self, text: str) -> None:
        self.parts += [text.strip(), ""]

    def table(self, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
        self.parts += [markdown_table(rows, headers), ""]

    def figure(self, file_name: str, caption: str) -> None:
        self.parts += [f"![{caption}]({file_name})", "", f"*{caption}*", ""]

    def json_block(self, obj: Any) -> None:
        self.parts += ["```json", json.dumps(to_jsonable(obj), indent=2), "```", ""]

    def write(self) -> Path:
        path = self.out_dir / "report.md"
        path.write_text("\n".join(self.parts))
        return path


_STAMP = re.compile(r"^> Mode: .*\n\n?", re.M)


def stamp_report(path: Path, *, quick: bool, seconds: float, command: str) -> None:
    """Write below the report's title which mode produced it (the runner calls this after each experiment).

    The stamp reads ``> Mode: quick (small sizes) · 12 s · 2026-11-23 16:40 UTC · `python -m experiments NAME --quick```;
    an earlier stamp is replaced. A missing report (the experiment failed early) is left alone.
    """
    path = Path(path)
    if not path.exists():
        return
    text = _STAMP.sub("", path.read_text(), count=1)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    mode = "quick (small sizes: figures are NOT the papers' sizes)" if quick else "full (the papers' sizes)"
    stamp = f"> Mode: {mode} · {seconds:.0f} s · {when} · `{command}`\n\n"
    lines = text.split("\n", 1)
    if lines[0].startswith("# ") and len(lines) == 2:
        text = lines[0] + "\n\n" + stamp + lines[1].lstrip("\n")
    else:
        text = stamp + text
    path.write_text(text)
