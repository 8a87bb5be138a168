"""The main job: ``scripts/quickstart`` runs the demo end to end, ends by itself and leaves nothing running."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import psutil
import pytest

from prefect_webhooks.demo.run import CALL_TYPES, expected_counts, report

ROOT = Path(__file__).resolve().parents[2]


def test_expected_counts_cover_every_message_kind() -> None:
    want = expected_counts()
    assert set(want) == {*CALL_TYPES, "delete"}
    # 1 identify call + 3 first-sync members + 2 membership changes.
    assert want["identify"] == 6
    assert sum(want.values()) == 12


def _processes_of(run_dir: Path) -> list[psutil.Process]:
    """Live processes whose command line or environment mentions the run folder."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            mentions = str(run_dir) in " ".join(process.info["cmdline"] or [])
            mentions = mentions or any(str(run_dir) in value for value in process.environ().values())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if mentions:
            found.append(process)
    return found


def _counts_table(output: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for kind in (*CALL_TYPES, "delete"):
        match = re.search(rf"^\s+{kind}\s+(\d+)\s+(\d+)$", output, re.M)
        assert match, f"no {kind} line in:\n{output}"
        counts[kind] = int(match[1])
    return counts


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_quickstart_runs_the_demo_and_cleans_up(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [str(ROOT / "scripts" / "quickstart"), "--run-dir", str(run_dir), "--timeout", "240"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:] + _logs(run_dir)

    assert _counts_table(done.stdout) == expected_counts()
    assert "signatures: 12/12 verified" in done.stdout
    ui = re.search(r"Prefect UI \(while the demo runs\): (http://127\.0\.0\.1:\d+)", done.stdout)
    assert ui, done.stdout
    # The address is given while the UI is up, before the traffic, with how to keep it up after the summary.
    early = re.search(r"Prefect UI, up while the demo runs and stops with it "
                      r"\(scripts/quickstart --linger 600 [^)]*\): (\S+)", done.stdout)
    assert early and early[1] == ui[1] and early.start() < done.stdout.index("sending identify"), done.stdout
    for flow in ("deliver", "audience-sync", "deletions"):
        assert re.search(rf"latest {flow} run: {re.escape(ui[1])}/runs/flow-run/[0-9a-f-]{{36}}", done.stdout)
    for key in ("delivery-", "audience-vip-users", "deletion-requests"):
        assert re.search(rf"artifact {key}\S*: {re.escape(ui[1])}/artifacts/artifact/[0-9a-f-]{{36}}", done.stdout), key
    # Nothing it started is still running: no Prefect server, no service, no flow-run process.
    assert _processes_of(run_dir) == []


def _logs(run_dir: Path) -> str:
    return "".join(f"\n--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in run_dir.glob("*.log"))


def test_report_shows_counts_signatures_and_links(tmp_path: Path) -> None:
    class Stack:
        run_dir = tmp_path
        prefect_port = 4999
        ui_url = "http://127.0.0.1:4999"

    result = {
        "counts": expected_counts(),
        "verified": 12,
        "rejected": 0,
        "links": {"artifacts": "http://127.0.0.1:4999/artifacts"},
    }
    text = report(result, Stack())  # type: ignore[arg-type]
    assert _counts_table(text) == expected_counts()
    assert "signatures: 12/12 verified" in text
    assert "artifacts: http://127.0.0.1:4999/artifacts" in text
    assert "the demo stops it now; scripts/quickstart --linger 600 keeps it up" in text
    assert "stops it now" not in report(result, Stack(), linger=600)  # type: ignore[arg-type]
