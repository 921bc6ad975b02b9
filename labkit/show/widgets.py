"""ipywidgets where a person decides: stage 02's sample explorer and stage 05's blind A/B rating.

In a live notebook each is a small widget; under `labkit run` (papermill, LABKIT_BATCH=1) or outside a Jupyter
kernel nothing can be clicked, so each shows a static table instead and the archived notebook stays readable.
The widgets' callbacks are plain methods (`SampleExplorer.show`, `ABRating.rate`), so they are driven directly.
"""

from __future__ import annotations

import html
import os
import random
from pathlib import Path
from typing import Any

import ipywidgets as w
from IPython import get_ipython

from labkit.core import io
from labkit.evaluate.human import RATINGS, ab_items, human_verdict, save_rating
from labkit.show import tables
from labkit.show.tokens import STYLE, render, render_pair

AB_SESSION = "human_ab.json"


def interactive() -> bool:
    """True in a live Jupyter kernel; False under `labkit run` (papermill) or in a plain Python process."""
    if os.environ.get("LABKIT_BATCH") == "1":
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class SampleExplorer:
    """Category, split and row → the rendered tokens with their loss positions (`labkit.show.tokens`).

    Args:
        tokenizer: the tokenizer.
        splits: the prepared rows per split.
        encoded: their encodings per split, aligned with the rows (`labkit.data.checks.run_checks`).
    """

    def __init__(self, tokenizer: Any, splits: dict[str, list[dict[str, Any]]], encoded: dict[str, list[Any]]) -> None:
        self.tokenizer, self.splits, self.encoded = tokenizer, splits, encoded
        categories = sorted({str(r.get("category")) for rows in splits.values() for r in rows})
        self.split = w.Dropdown(options=list(splits), description="split")
        self.category = w.Dropdown(options=categories, description="category")
        self.row = w.BoundedIntText(value=0, min=0, max=0, description="row")
        self.view = w.HTML()
        for control in (self.split, self.category):
            control.observe(self._on_filter, names="value")
        self.row.observe(self._on_row, names="value")
        self._on_filter()
        self.widget = w.VBox([w.HBox([self.split, self.category, self.row]), self.view])

    def indices(self) -> list[int]:
        """Row positions of the chosen split that belong to the chosen category."""
        rows = self.splits[self.split.value]
        return [i for i, r in enumerate(rows) if str(r.get("category")) == self.category.value]

    def show(self, split: str, category: str, row: int) -> str:
        """Select a split, category and row (as the controls do) and return the HTML shown."""
        self.split.value, self.category.value = split, category
        self.row.value = row
        return self.view.value

    def _on_filter(self, change: Any = None) -> None:
        self.row.max = max(0, len(self.indices()) - 1)
        self.row.value = 0
        self._on_row()

    def _on_row(self, change: Any = None) -> None:
        found = self.indices()
        if not found:
            self.view.value = f"<p>no {html.escape(self.category.value)} rows in {self.split.value}</p>"
            return
        i = found[min(self.row.value, len(found) - 1)]
        row, enc = self.splits[self.split.value][i], self.encoded[self.split.value][i]
        title = f"{row.get('id')} · {self.split.value} · category {row.get('category')} · row {self.row.value + 1} of {len(found)}"
        body = render_pair(self.tokenizer, enc, title) if hasattr(enc, "rejected") else render(self.tokenizer, enc, title)
        self.view.value = STYLE + body


def sample_explorer(tokenizer: Any, splits: dict[str, list[dict[str, Any]]], encoded: dict[str, list[Any]]) -> Any:
    """Stage 02's explorer: a widget in a live notebook, else the rows per split and category as a table.

    Returns:
        an ipywidgets VBox, or a displayable table.
    """
    if interactive():
        return SampleExplorer(tokenizer, splits, encoded).widget
    counts: dict[tuple[str, str], list[str]] = {}
    for name, rows in splits.items():
        for r in rows:
            counts.setdefault((str(r.get("category")), name), []).append(str(r.get("id")))
    return tables.table([{"category": c, "split": s, "rows": len(ids), "first_ids": ", ".join(ids[:4])}
                         for (c, s), ids in sorted(counts.items())])


def ab_session(run_dir: Path, per_category: int = 3) -> dict[str, Any]:
    """The run's blind A/B items: made once with a fresh seed (`comparison/human_ab.json`), then reused.

    Args:
        run_dir: the run folder (stage 01's and 05's predictions).
        per_category: examples per category.
    Returns:
        {"seed", "items"}.
    """
    path = Path(run_dir) / "comparison" / AB_SESSION
    if path.exists():
        return io.read_json(path)
    base = io.read_jsonl(Path(run_dir) / "baseline" / "baseline_predictions.jsonl")
    tuned = io.read_jsonl(Path(run_dir) / "comparison" / "tuned_predictions.jsonl")
    seed = random.SystemRandom().randrange(2**31)
    session = {"seed": seed, "per_category": per_category, "items": ab_items(base, tuned, seed, per_category)}
    io.write_json(path, session)
    return session


class ABRating:
    """One item at a time: the prompt, the reference, answers A and B; buttons A, B, tie; the ratings as data.

    Args:
        run_dir: the run folder; ratings go to comparison/human_ratings.jsonl.
        rater: who rates (kept with every rating).
    """

    def __init__(self, run_dir: Path, rater: str = "", per_category: int = 3) -> None:
        self.run_dir, self.rater = Path(run_dir), rater
        self.session = ab_session(self.run_dir, per_category)
        self.path = self.run_dir / "comparison" / RATINGS
        done = {r["id"] for r in io.read_jsonl(self.path)} if self.path.exists() else set()
        self.position = next((i for i, it in enumerate(self.session["items"]) if it["id"] not in done),
                             len(self.session["items"]))
        self.view = w.HTML()
        self.buttons = [w.Button(description=label) for label in ("A is better", "B is better", "tie")]
        for button, choice in zip(self.buttons, ("a", "b", "tie")):
            button.on_click(lambda _b, c=choice: self.rate(c))
        self.widget = w.VBox([self.view, w.HBox(self.buttons)])
        self._draw()

    def rate(self, choice: str) -> dict[str, Any] | None:
        """Record a choice for the current item and move to the next (a button's callback).

        Returns:
            the rating written, or None when every item is rated.
        """
        items = self.session["items"]
        if self.position >= len(items):
            return None
        line = save_rating(self.path, items[self.position], choice, self.session["seed"], self.rater)
        self.position += 1
        self._draw()
        return line

    def _draw(self) -> None:
        items = self.session["items"]
        if self.position >= len(items):
            verdict = human_verdict(self.path)
            self.view.value = f"<p><b>All {len(items)} items rated.</b> {html.escape(verdict['verdict'] if verdict else '')}</p>"
            for button in self.buttons:
                button.disabled = True
            return
        it = items[self.position]
        pre = "<pre style='white-space:pre-wrap'>{}</pre>"
        self.view.value = (f"<p>item {self.position + 1} of {len(items)} · category {html.escape(str(it['category']))}</p>"
                           f"<b>prompt</b>{pre.format(html.escape(it['input']))}<b>reference</b>"
                           f"{pre.format(html.escape(it['target']))}<b>A</b>{pre.format(html.escape(it['a']))}"
                           f"<b>B</b>{pre.format(html.escape(it['b']))}")


def ab_rating(run_dir: str | Path, rater: str = "", per_category: int = 3) -> Any:
    """Stage 05's blind A/B rating: a widget in a live notebook, else the human verdict (or how many items wait).

    Returns:
        an ipywidgets VBox, or a displayable table.
    """
    if interactive():
        return ABRating(Path(run_dir), rater, per_category).widget
    verdict = human_verdict(Path(run_dir) / "comparison" / RATINGS)
    if verdict is None:
        return tables.md(f"No human ratings yet. To rate {per_category} examples per category, base and tuned shown "
                         "blind as A and B, run in a JupyterLab notebook: `from labkit.show.widgets import ab_rating; "
                         f"ab_rating(\"{run_dir}\")`.")
    return tables.table([{k: verdict[k] for k in ("rated", "tuned", "baseline", "tie", "agreement", "kappa", "seed")}])
