"""Examples that share a source (`data.fields.group`): the seeded split keeps each group on one side, and a group that
given splits share is leakage under `data.leakage.policy`; leakage that leaves no training row is named with its fix."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.cli.main import main as cli_main
from labkit.data import sources as D
from labkit.data.prepare import derive_splits
from labkit.errors import LeakageError

TEAMS = ("infra", "payments", "mobile", "legal")
WORDS = ("plan", "ship", "fix", "review", "call", "budget", "hire", "audit")


def _notes(n_groups: int = 60, seed: int = 4) -> list[dict]:
    """Meeting notes in threads of 1-5 notes; a thread's notes share a team, now and then one of another team."""
    rng = random.Random(seed)
    rows = []
    for g in range(n_groups):
        team = TEAMS[g % len(TEAMS)]
        for k in range(rng.randint(1, 5)):
            other = rng.random() < 0.15 and k > 0
            words = " ".join(rng.choice(WORDS) for _ in range(12))
            rows.append({"note": f"thread {g} note {k}: {words} {g * 31 + k}",
                         "summary": f"{team} decided item {g}-{k}", "team": rng.choice(TEAMS) if other else team,
                         "note_id": f"n{g:03d}-{k}", "thread": f"th{g:03d}"})
    return rows


def _card(folder: Path, rows: list[dict], group: str | None = "thread", **data) -> Path:
    (folder / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = yaml.safe_load((REPO / "params" / "examples" / "dialogue-summary-smollm2.yaml").read_text())
    raw["model"] = {"source": "tiny:llama", "dtype": "float32"}
    raw["data"].update({"source": {"path": "notes.jsonl"}, "cleaning": [],
                        "fields": {"input": "note", "target": "summary", "category": "team", "id": "note_id",
                                   "group": group}, **data})
    path = folder / "card.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _split(folder: Path, rows: list[dict], group: str | None = "thread") -> dict[str, list[dict]]:
    data = load_card(_card(folder, rows, group)).card.data
    return D.split_rows(data, D.map_fields(data, rows))


def test_a_group_stays_on_one_side_stratified_by_its_usual_category(tmp_path: Path) -> None:
    rows = _notes()
    splits = _split(tmp_path, rows)
    assert D.groups_across_splits(splits) == []
    assert sum(map(len, splits.values())) == len(rows) and all(splits.values())
    for name in D.SPLITS:  # every thread's notes are together in one split
        for r in splits[name]:
            assert all(o["note_id"] in {x["id"] for x in splits[name]} for o in rows if o["thread"] == r["group"])
    threads = {name: sorted({r["group"] for r in splits[name]}) for name in D.SPLITS}
    teams: dict[str, list[str]] = {}
    for r in rows:
        teams.setdefault(r["thread"], []).append(r["team"])
    usual = {t: min(v, key=lambda team: (-v.count(team), team)) for t, v in teams.items()}  # ties: by name
    assert usual != {f"th{g:03d}": TEAMS[g % len(TEAMS)] for g in range(60)}  # a thread's other-team notes can decide
    for team in TEAMS:  # each team's threads, not rows, are cut: round(n x 0.15) to validation and to test
        n = sum(v == team for v in usual.values())
        got = [len([t for t in threads[name] if usual[t] == team]) for name in ("validation", "test")]
        assert got == [round(n * 0.15)] * 2, (team, n, got)
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    assert _split(tmp_path, shuffled) == splits  # the order of the source rows does not matter


def test_without_a_group_each_row_is_its_own_unit(tmp_path: Path) -> None:
    rows = _notes()
    plain = _split(tmp_path, rows, group=None)
    assert D.groups_across_splits(plain) == []  # rows carry no group
    assert all("group" not in r for split in plain.values() for r in split)
    as_own_group = _split(tmp_path, [{**r, "thread": r["note_id"]} for r in rows])
    ids = {k: [r["id"] for r in v] for k, v in plain.items()}
    assert {k: [r["id"] for r in v] for k, v in as_own_group.items()} == ids
    grouped = _split(tmp_path, rows)
    assert D.groups_across_splits({k: [{**r, "group": r["id"].split("-")[0]} for r in v] for k, v in plain.items()})
    assert grouped["validation"] != plain["validation"]  # a row split scatters the threads that the grouped one keeps


def test_a_group_shared_by_given_splits_is_leakage(tmp_path: Path, tiny_model, capsys) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model.location)
    rows = _notes(24)
    for r in rows:  # splits given by thread ...
        n = int(r["thread"][2:])
        r["split"] = "validation" if n % 6 == 1 else "test" if n % 6 == 2 else "train"
    threads = [t for t in sorted({r["thread"] for r in rows if r["split"] == "train"})
               if sum(r["thread"] == t for r in rows) >= 2][:2]
    into = dict(zip(threads, ("validation", "test")))
    for t, name in into.items():  # ... but two training threads have one note in validation or test
        next(r for r in rows if r["thread"] == t)["split"] = name
    size = {t: sum(r["thread"] == t for r in rows) for t in threads}

    derived = derive_splits(load_card(_card(tmp_path, rows, split={"field": "split"})).card, tok)
    assert derived.leakage["groups_across_splits"] == [{"group": t, "rows": {"train": size[t] - 1, into[t]: 1}}
                                                       for t in threads]
    dropped = sorted(r["note_id"] for r in rows if r["thread"] in into and r["split"] == "train")
    assert derived.leakage["dropped_from_train"] == dropped  # drop_from_train: the group's training rows
    assert not {r["group"] for r in derived.splits["train"]} & set(into)
    assert {r["group"] for r in derived.splits["validation"] + derived.splits["test"]} >= set(into)

    card = load_card(_card(tmp_path, rows, split={"field": "split"}, leakage={"policy": "report"})).card
    kept = derive_splits(card, tok)
    assert kept.leakage["dropped_from_train"] == [] and len(kept.leakage["groups_across_splits"]) == 2
    card = load_card(_card(tmp_path, rows, split={"field": "split"}, leakage={"policy": "fail"})).card
    with pytest.raises(LeakageError, match=rf"2 group\(s\) of data\.fields\.group in more than one split, e\.g\. "
                                           rf"'{threads[0]}' \(train {size[threads[0]] - 1}, validation 1 rows\); "
                                           r"policy is fail \(keep each group in one split"):
        derive_splits(card, tok)

    assert cli_main(["check", "--data", str(_card(tmp_path, rows, split={"field": "split"}))]) == 0
    said = capsys.readouterr().out
    assert f"rows in 24 groups (2 in more than one split, their {len(dropped)} training rows dropped)" in said
    assert (f"; {len(dropped)} removed: {len(dropped)} by data.leakage (training rows that repeat an evaluation row or "
            "share a group with one); every reference" in said)
    fractions = _card(tmp_path, rows, split={"validation": 0.2, "test": 0.2})
    assert cli_main(["check", "--data", str(fractions)]) == 0
    assert "rows in 24 groups (none in more than one split)" in capsys.readouterr().out


def test_leakage_that_drops_every_training_row_names_the_cause_and_a_threshold_that_keeps_them(
        tmp_path: Path, tiny_model, capsys) -> None:
    """Notes written from one template (only the closing number differs) read as near duplicates of each other: the
    line says how many rows went and at what similarity, and the threshold it proposes lets the data through."""
    rows = _notes(30)
    for r in rows:
        r["note"] = ("the weekly planning sync of the whole team moved to the large meeting room on the third floor "
                     f"next to the kitchen and the booking number is {r['note_id']}")
    card = _card(tmp_path, rows, split={"validation": 0.2, "test": 0.2})
    assert cli_main(["check", "--data", str(card)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    found = re.search(r"data\.leakage: policy drop_from_train dropped all (\d+) training rows, (\d+) as duplicates of "
                      r"validation/test rows at similarity 0\.\d{3}–(0\.\d{3}), so nothing is left to train on "
                      r"\(threshold 0\.85\); if they are different examples \(rows written from one template\), "
                      r"raise data\.leakage\.near_duplicate_threshold above (0\.\d{3}), or set "
                      r"data\.leakage\.policy: report", err)
    assert found and found[1] == found[2] and found[3] == found[4], err
    raised = _card(tmp_path, rows, split={"validation": 0.2, "test": 0.2},
                   leakage={"near_duplicate_threshold": float(found[4]) + 0.001})
    assert cli_main(["check", "--data", str(raised)]) == 0


def test_a_category_only_inside_groups_of_another_names_the_groups(tmp_path: Path) -> None:
    """A category whose rows all sit in threads of another team goes where those threads go: here to validation."""
    rows = _notes()
    splits = _split(tmp_path, rows)
    notes = {t: [r["team"] for r in rows if r["thread"] == t] for t in {r["group"] for r in splits["validation"]}}
    thread = min(t for t, teams in notes.items() if len(set(teams)) == 1 and len(teams) >= 3)
    next(r for r in rows if r["thread"] == thread)["team"] = "security"  # one note of a thread of three or more
    with pytest.raises(D.DataError, match=rf"^data\.split: category 'security' in validation but not in train; "
                                          r"its rows lie in 1 group\(s\) of data\.fields\.group "
                                          rf"\(e\.g\. '{thread}'\), and the split keeps each group whole, in the "
                                          r"stratum of its most frequent category "
                                          r"\(add training rows for it or drop it\)$"):
        _split(tmp_path, rows)
    alone = _split(tmp_path, rows, group=None)  # rows split alone: the one row is its stratum's only unit, in train
    assert [r["category"] for r in alone["train"]].count("security") == 1
