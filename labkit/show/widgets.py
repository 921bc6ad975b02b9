"""ipywidgets where a person decides: stage 02's sample explorer and stage 05's blind A/B rating.

In a live notebook each is a small widget; under `labkit run` (papermill, LABKIT_BATCH=1) or outside a Jupyter
kernel nothing can be clicked, so each shows a static table instead and the archived notebook stays readable.
The widgets' callbacks are plain methods (`SampleExplorer.show`, `ABRating.rate`), so they are driven directly.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

import ipywidgets as w
from IPython import get_ipython

from labkit.core import io
from labkit.data.conversations import readable
from labkit.evaluate.ab_session import ab_files, ab_session
from labkit.evaluate.human import human_verdict, rater_view, save_rating
from labkit.show import tables
from labkit.show.tokens import STYLE, render, render_pair


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


class ABRating:
    """One item at a time: the prompt and answers A and B (the reference hidden until every item is rated);
    buttons A, B, tie; the ratings as data, each with the blind order, the seed and the answers' sources.

    Args:
        run_dir: the run folder; ratings go to its comparison folder (`labkit.evaluate.ab_session.ab_files`).
        rater: who rates (kept with every rating).
        per_category: examples per category.
        against: another run's folder: its tuned answers against this run's (two variants), instead of the base
            model's against this run's.
    """

    def __init__(self, run_dir: str | Path, rater: str = "", per_category: int = 3,
                 against: str | Path | None = None) -> None:
        self.run_dir, self.rater = Path(run_dir), rater
        self.session = ab_session(self.run_dir, per_category, against)
        _, self.path = ab_files(self.run_dir, Path(against) if against is not None else None)
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
        line = save_rating(self.path, items[self.position], choice, self.session["seed"], self.rater,
                           self.session["sides"], self.session["sources"])
        self.position += 1
        self._draw()
        return line

    def reveal(self) -> str:
        """After rating: every item with its reference, which source was A and B, and the choice (HTML)."""
        chosen = {r["id"]: r["choice"] for r in io.read_jsonl(self.path)} if self.path.exists() else {}
        rows = [{"item": it["position"] + 1, "category": it["category"], "reference": it["target"],
                 "A": f"{it['a_is']}: {it['a']}", "B": f"{it['b_is']}: {it['b']}", "choice": chosen.get(it["id"], "")}
                for it in self.session["items"]]
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0]) if rows else ""
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
        return f"<details><summary>Reveal the references and sources</summary><table>{head}{body}</table></details>"

    def _draw(self) -> None:
        items = self.session["items"]
        if self.position >= len(items):
            verdict = human_verdict(self.path)
            self.view.value = (f"<p><b>All {len(items)} items rated.</b> "
                               f"{html.escape(verdict['verdict'] if verdict else '')}</p>" + self.reveal())
            for button in self.buttons:
                button.disabled = True
            return
        seen = rater_view(items[self.position])  # never the reference nor the sources before the rating
        pre = "<pre style='white-space:pre-wrap'>{}</pre>"
        self.view.value = (f"<p>item {self.position + 1} of {len(items)} · category {html.escape(str(seen['category']))}"
                           f"</p><b>prompt</b>{pre.format(html.escape(readable(seen['input'])))}"
                           f"<b>A</b>{pre.format(html.escape(seen['a']))}<b>B</b>{pre.format(html.escape(seen['b']))}")


def ab_rating(run_dir: str | Path, rater: str = "", per_category: int = 3, against: str | Path | None = None) -> Any:
    """Stage 05's blind A/B rating: a widget in a live notebook, else the human verdict (or how many items wait).

    Args:
        run_dir: the run folder.
        rater: who rates.
        per_category: examples per category.
        against: another run's folder, to rate two variants' answers instead of base against tuned.
    Returns:
        an ipywidgets VBox, or a displayable table.
    """
    if interactive():
        return ABRating(Path(run_dir), rater, per_category, against).widget
    _, path = ab_files(Path(run_dir), Path(against) if against is not None else None)
    verdict = human_verdict(path)
    if verdict is None:
        pair = "base and tuned" if against is None else f"run {Path(against).name} and this run"
        call = f'ab_rating("{run_dir}"' + ("" if against is None else f', against="{against}"') + ")"
        return tables.md(f"No human ratings yet. To rate {per_category} examples per category, {pair} shown blind "
                         f"as A and B, run in a JupyterLab notebook: `from labkit.show.widgets import ab_rating; {call}`.")
    first, second = verdict["sides"]
    return tables.table([{"rated": verdict["rated"], second: verdict["wins"], first: verdict["losses"],
                          "tie": verdict["ties"], **{k: verdict[k] for k in ("agreement", "kappa", "seed")}}])
