"""The main job: ``scripts/quickstart`` runs the demo end to end, its runs show in the Prefect UI, and it leaves
nothing running."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from collections import Counter
from pathlib import Path

import psutil
import pytest

from prefect_webhooks.demo.run import CALL_TYPES, expected_counts, report
from tests.demo.test_ui import check_artifact_pages

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


@pytest.mark.shares_machine
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quickstart_runs_the_demo_its_runs_show_in_the_ui_and_ctrl_c_cleans_up(tmp_path: Path) -> None:
    """The README's quickstart, kept up with ``--linger`` (one demo run serves both checks): the summary, the
    Prefect UI rendering the runs' artifacts while it lingers, then Ctrl-C ending it with nothing left running."""
    run_dir = tmp_path / "run"
    # Started with SIGINT ignored, as a script's background job is (`scripts/quickstart --linger 600 &`): Ctrl-C, or
    # `kill -INT`, ends it all the same.
    process = subprocess.Popen(
        ["bash", "-c", 'trap "" INT; exec "$0" "$@"', str(ROOT / "scripts" / "quickstart"), "--run-dir",
         str(run_dir), "--timeout", "240", "--linger", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    output: list[str] = []
    lingering = threading.Event()

    def read_output() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if line.startswith("keeping everything up for"):
                lingering.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        assert lingering.wait(400), "".join(output)[-4000:] + _logs(run_dir)
        stdout = "".join(output)
        assert _counts_table(stdout) == expected_counts()
        assert "signatures: 12/12 verified" in stdout
        ui = re.search(r"Prefect UI \(while the demo runs\): (http://127\.0\.0\.1:\d+)", stdout)
        assert ui, stdout
        # The address is given while the UI is up, before the traffic.
        early = re.search(r"Prefect UI, up while the demo runs and for 600 s after the summary: (\S+)", stdout)
        assert early and early[1] == ui[1] and early.start() < stdout.index("sending identify"), stdout
        for flow in ("deliver", "audience-sync", "deletions"):
            assert re.search(rf"latest {flow} run: {re.escape(ui[1])}/runs/flow-run/[0-9a-f-]{{36}}", stdout)
        for key in ("delivery-", "audience-vip-users", "deletion-requests"):
            assert re.search(rf"artifact {key}\S*: {re.escape(ui[1])}/artifacts/artifact/[0-9a-f-]{{36}}", stdout), key
        check_artifact_pages(ui[1], tmp_path / "chromium")
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C ends the lingering early
        try:
            process.wait(120)
        finally:
            if process.poll() is None:
                process.kill()
        reader.join(10)
    assert process.returncode == 0, "".join(output)[-4000:] + _logs(run_dir)
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
