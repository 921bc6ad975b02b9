"""`labkit.cli.summary`: the verdict line that ends `labkit run`, and `labkit compare`'s table."""

from __future__ import annotations

from labkit.cli.summary import cut, text_table
from labkit.evaluate.verdict_text import verdict_line

PRIMARY = {"metric": "field_accuracy", "ok": False, "reference": 0.1, "baseline": 0.1, "tuned": 0.15, "gain": 0.05,
           "gain_low": -0.05, "gain_high": 0.15, "level": 0.95, "n": 12, "rule": "interval"}
RAILS = [{"metric": "json_valid_rate", "ok": True}, {"metric": "stop_rate", "ok": False},
         {"metric": "per_category_f1", "ok": True}]


def test_the_verdict_line_has_the_word_the_metric_its_interval_the_pairs_the_guardrails_and_the_budget() -> None:
    decision = {"against": "baseline", "primary": PRIMARY, "guardrails": RAILS, "confirmed": False,
                "decision": "not confirmed", "verdict": "NOT CONFIRMED against the baseline: …"}
    line = verdict_line(decision, {"key": "field_accuracy", "wins": 3, "losses": 1, "ties": 8},
                        "budget-stopped at 8/24 steps")
    assert line == ("NOT CONFIRMED · field_accuracy 0.100 → 0.150 (gain +0.050, 95% interval [-0.050, +0.150] on "
                    "n = 12 examples) · 3 wins / 1 losses / 8 ties · guardrails 2/3 pass, failing: stop_rate · "
                    "budget-stopped at 8/24 steps")
    confirmed = verdict_line({**decision, "decision": "confirmed", "guardrails": RAILS[:1]})
    assert confirmed.startswith("CONFIRMED · ") and confirmed.endswith("· guardrails 1/1 pass")


def test_a_verdict_not_judged_says_why_cut_to_the_line() -> None:
    decision = {"against": "r16", "primary": {"metric": "field_accuracy"}, "guardrails": [], "confirmed": False,
                "decision": "not judged", "verdict": "NOT JUDGED: the hypothesis is against variant 'r16', " + "x" * 200}
    line = verdict_line(decision)
    assert line.startswith("NOT JUDGED · the hypothesis is against variant 'r16'") and line.endswith("…")
    assert len(line) < 130


def test_the_text_table_fits_its_width_and_cuts_with_an_ellipsis() -> None:
    rows = [{"run": "tiny-lora-20261202T2230Z-ab12", "status": "completed (budget)", "verdict": "NOT CONFIRMED " * 20},
            {"run": "r16", "status": "completed", "verdict": "CONFIRMED"}]
    lines = text_table(rows, width=80)
    assert len(lines) == 4 and all(len(line) <= 80 for line in lines)
    assert lines[0].split() == ["run", "status", "verdict"] and lines[2].endswith("…")
    assert "completed (budget)" in lines[2] and lines[3].rstrip().endswith("CONFIRMED")
    assert cut("a  b\nc", 10) == "a b c" and cut("abcdef", 4) == "abc…"
