"""`labkit.cli.summary`: the verdict line that ends `labkit run`, and `labkit compare`'s table."""

from __future__ import annotations

from labkit.cli.summary import compare_lines, cut, short_runs, text_table
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


def test_compare_lines_fit_118_columns_and_keep_the_flags_as_notes() -> None:
    steps = {"steps": 8, "planned": 24, "budget_stopped": True, "budget_is_protocol": False}
    comparison = {"experiment": "quickstart", "reference": "lora-r16-20261202T223000Z-ab12cd34",
                  "runs": [{"run_id": "lora-r16-20261202T223000Z-ab12cd34", "status": "completed",
                            "training_steps": {**steps, "steps": 24, "budget_stopped": False}, "guardrails_failed": [],
                            "decision": {"decision": "confirmed"}},
                           {"run_id": "lora-r4-with-a-long-variant-name-20261202T224500Z-ef56ab78",
                            "status": "completed", "training_steps": steps, "guardrails_failed": ["stop_rate"],
                            "decision": {"decision": "not confirmed"}}],
                  "pairs": [{"a": "lora-r16-20261202T223000Z-ab12cd34",
                             "b": "lora-r4-with-a-long-variant-name-20261202T224500Z-ef56ab78",
                             "steps": {"comparable": False, "why": "24/24 steps vs 8/24 (budget-stopped; …)",
                                       "a": "24/24", "b": "8/24"}}]}
    flat = [{"run": "lora-r16", "status": "completed", "primary": "field_accuracy = 0.583 [0.517, 0.650]",
             "gain vs reference [95% CI]": "+0.316 [+0.250, +0.383]", "wins/losses/ties": "40/3/17",
             "verdict": "CONFIRMED"},
            {"run": "lora-r4", "status": "completed (budget)", "primary": "field_accuracy = 0.317 [0.250, 0.383]",
             "gain vs reference [95% CI]": "+0.050 [-0.017, +0.117]", "wins/losses/ties": "10/8/42",
             "verdict": "NOT CONFIRMED against the baseline · budget-stopped at 8/24 steps"}]
    pairs = [{"A": "lora-r16 · …", "B": "lora-r4 · …", "metric": "field_accuracy",
              "B − A [95% CI]": "-0.267 [-0.350, -0.183] · NOT COMPARABLE: 24/24 steps vs 8/24 (budget-stopped; …)",
              "B wins/losses/ties": "3/40/17"}]
    lines = compare_lines(comparison, flat, pairs, [])
    assert all(len(line) <= 118 for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert "completed (budget)" in text and "NOT CONFIRMED" in text and "+0.050 [-0.017, +0.117]" in text
    assert "-0.267 [-0.350, -0.183]" in text and "run against run (B − A on field_accuracy):" in text
    assert lines[3].split()[-1] == "CONFIRMED" and lines[4].endswith("NOT CONFIRMED")  # the decision word alone
    assert "…r4-with-…riant-name 1202T2245" in text  # a run id: its variant (shared prefix "…") and its start
    assert "  …r4-with-…riant-name 1202T2245: budget-stopped at 8/24 steps" in lines
    assert any(line.endswith("guardrail failed: stop_rate") for line in lines)
    assert "NO: 24/24 vs 8/24 steps" in text and "NOT COMPARABLE" not in lines[-1]


def test_variants_that_share_a_long_prefix_stay_apart() -> None:
    start = "-20261205T232000Z-248da0a7"
    family = ["quickstart-lora-r16", "quickstart-qlora-r16", "quickstart-lora-r16-earlystop", "quickstart-dpo"]
    cells = short_runs([v + start for v in family])
    assert list(cells.values()) == ["…lora-r16 1205T2320", "…qlora-r16 1205T2320", "…lora-r16-earlystop 1205T2320",
                                    "…dpo 1205T2320"]
    short = ["gemma2-lora-r8", "gemma2-lora-r16-long"]  # 20 characters or fewer: whole
    assert list(short_runs([v + start for v in short]).values()) == [v + " 1205T2320" for v in short]
    (alone,) = short_runs(["a-single-variant-named-at-length" + start]).values()  # cut in the middle, time kept
    assert alone == "a-single-…-at-length 1205T2320"
    assert short_runs(["not-a-run-id-of-labkit-at-all"]) == {"not-a-run-id-of-labkit-at-all": "not-a-run-id-of-labki…"}
