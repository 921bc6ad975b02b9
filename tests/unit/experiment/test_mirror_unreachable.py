"""An unreachable MLflow server is found once, quickly, and the mirror is switched off for the run with one warning;
credentials in a URI never reach a message."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from conftest import REPO

from labkit.card.load import load_card
from labkit.core import runs as R
from labkit.core.secrets import redact
from labkit.experiment.tracking import REACH_SECONDS, mirror_safely


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_server_switches_the_mirror_off_once(tmp_path: Path, capsys) -> None:
    card = tmp_path / "tracked.yaml"
    card.write_text(f"parent: {REPO / 'params' / 'smoke.yaml'}\n"
                    f"tracking: {{mlflow: {{uri: 'http://127.0.0.1:{_closed_port()}'}}}}\n")
    run = R.new_run(load_card(card), tmp_path / "runs")
    start = time.monotonic()
    assert mirror_safely(run) == {}
    assert mirror_safely(run, final=True) == {}  # every later update of the run: no new attempt
    assert time.monotonic() - start < REACH_SECONDS + 2
    warnings = [line for line in capsys.readouterr().err.splitlines() if "MLflow" in line]
    assert len(warnings) == 1 and "cannot be reached" in warnings[0] and "mirror is off" in warnings[0]


def test_credentials_are_redacted_from_any_uri_in_a_message() -> None:
    text = "failed: https://alice:s3cret@mlflow.example:5000/api and postgresql://u:p@db/x and http://plain/x"
    assert redact(text) == "failed: https://***@mlflow.example:5000/api and postgresql://***@db/x and http://plain/x"
