"""The benchmarks in ``bench/`` still start and finish: nothing else runs them, so a refactor could break one silently.

Every benchmark module is imported (what broke ``bench_soak.py`` once: a name it imported from ``bench_capacity``
was gone), and the ones that finish in seconds at a tiny size run end to end and must print their figures. The rest
run at full size by hand (``bench/README.md``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_every_benchmark_module_imports() -> None:
    modules = sorted(path.stem for path in BENCH.glob("*.py"))
    assert "bench_soak" in modules and "bench_capacity" in modules
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r})\n" + "\n".join(f"import {name}" for name in modules)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=BENCH)
    assert done.returncode == 0, done.stderr[-3000:]


# A benchmark, tiny arguments, and a line of figures its output must hold.
TINY_RUNS = {
    "bench_audience": (["--members", "200", "--churn", "0.1", "--destinations", "1"],
                       r"incremental worst: [\d.]+ s, \d+ MB peak RSS"),
    "bench_dedupe": (["--sizes", "0", "5000", "--calls", "5", "--batch", "200"],
                     r"window of 5,000 ids .* B per id on disk(.|\n)*this release: +p50 +[\d.]+ ms .*repeats found \d+"
                     r"(.|\n)*previous layout: +p50 +[\d.]+ ms .*repeats found \d+"),
    "bench_delivery": (["--messages", "200"],
                       r"raw aiohttp POST loop \(ceiling\)\s+\d+ msg/s(.|\n)*deliver_due \(outbox\)\s+\d+ msg/s"),
    "bench_client": (["--messages", "200", "--endpoints", "sink"],
                     r"delivered throughput ratio \(ours / Segment\): [\d.]+x"),
    "bench_group_commit": (["--commits", "20", "--rounds", "1"],
                           r"group commit of 1 call\(s\), SQLite, fresh store: best [\d.]+ µs a commit"),
    "bench_slow_retries": (["--messages", "12", "--rounds", "1"],
                           r"this checkout:\n +retry after its due time: sent p50 +[\d.]+ ms +p99 +[\d.]+ ms"),
    "bench_ordered_retries": (["--users", "10", "--per-user", "3", "--rounds", "1", "--limit", "12"],
                              r"ordered / unordered drain \(best of 1 each\): [\d.]+ s / [\d.]+ s"),
    "bench_live_lookups": (["--kept", "3000", "--probes", "3", "--rate", "200", "--lead-seconds", "2"],
                           r"idle serve, just started \(3,000 messages kept\)(.|\n)*lookup by user, newest 50: first "
                           r"[\d.]+ ms(.|\n)*while 200 events/s flow(.|\n)*console: a destination \(24-hour chart, "
                           r"top reasons\): first [\d.]+ ms(.|\n)*console: one message \(attempts, the request as "
                           r"sent now\): first [\d.]+ ms(.|\n)*the stream: [\d,]+ accepted.* lost 0"),
    "bench_record_transaction": (["--batch", "100", "--rounds", "2"],
                                 r"packed ahead \(this release\) +transaction +[\d.]+ ms(.|\n)*"
                                 r"packed inside \(reference\) +transaction +[\d.]+ ms(.|\n)*write lock held: [\d.]+x"),
    "bench_request_path": (["--quick"], r"aiohttp-session +uvloop +\| +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +1\.00\n(.|\n)*"
                                        r"pycurl-transport +uvloop +\| +\d+ +[\d.]+(.|\n)*"
                                        r"pyreqwest-streamed +uvloop +\| +\d+ +[\d.]+(.|\n)*CPU reference"),
    "request_path_features": ([], r"feature matrix: 2 clients checked; missing: none"),
    "bench_write_gate": (["--seconds", "0.5", "--cases", "1"],
                         r"busy handler \(reference\): +\d+ transactions/s(.|\n)*write gate: +\d+ transactions/s"),
    "bench_message_log": (["--kept", "3000", "--hot-messages", "1000", "--rounds", "1", "--probes", "20"],
                          r"log size: \d+ B per kept message(.|\n)*lookup by messageId: p50 [\d.]+ ms"
                          r"(.|\n)*console page destination \(chart, reasons\): p50 [\d.]+ ms"
                          r"(.|\n)*hot path .* nothing kept, same newest partition [\d,]+/s; with 3,000 kept "
                          r"[\d,]+/s"),
}


@pytest.mark.parametrize("name", sorted(TINY_RUNS))
def test_a_quick_benchmark_runs_at_a_tiny_size_and_prints_its_figures(name: str) -> None:
    arguments, figures = TINY_RUNS[name]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_"))}
    done = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *arguments], capture_output=True, text=True,
                          timeout=240, env=env, cwd=BENCH.parent)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert re.search(figures, done.stdout), done.stdout[-3000:]


def test_history_built_twice_adds_up_and_status_counts_it(tmp_path: Path) -> None:
    """The documented history builder adds to a store it built before (fresh ids), and ``status`` counts what the
    log keeps: sealed partitions once, again after the second build wrote into them."""
    store = f"sqlite:///{tmp_path / 'aged.db'}"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_"))}
    env["PREFECT_WEBHOOKS_DATABASE_URL"] = store
    status = [sys.executable, "-m", "prefect_webhooks.cli", "status"]
    for kept in (2000, 4000):
        built = subprocess.run([sys.executable, str(BENCH / "bench_message_log.py"), "--build-only", "--kept", "2000",
                                "--store", store], capture_output=True, text=True, timeout=240, env=env,
                               cwd=BENCH.parent)
        assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
        shown = subprocess.run(status, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr[-3000:]
        counted = re.search(r"kept in the message log: ([\d,]+) messages \(([\d,]+) delivered or filtered, ([\d,]+) "
                            r"failed\)", shown.stdout)
        assert counted, shown.stdout
        total, delivered, failed = (int(group.replace(",", "")) for group in counted.groups())
        assert total == kept and delivered + failed == kept and 0 < failed < kept // 10
        remembered = re.search(r"remembered for the dedupe window: ([\d,]+) messageIds", shown.stdout)
        assert remembered, shown.stdout
        # Every delivered message's id (received within the day), and the failed ones' of the last day.
        assert delivered <= int(remembered.group(1).replace(",", "")) <= kept


def test_the_receiver_outage_figures_count_from_the_recovery() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from receiver_fault import caught_up, delays_back_under
    finally:
        sys.path.remove(str(BENCH))
    # 100/s offered from t=0; nothing arrives in seconds 10–19 (the outage), 300/s from 20 until the backlog is gone.
    per_second = {second: 100 for second in range(10)}
    per_second.update({second: 300 for second in range(20, 25)})
    per_second.update({second: 100 for second in range(25, 40)})
    assert caught_up(per_second, 100.0, 0.0, 20.0, 40.0) == 5.0
    worst = {second: 0.1 for second in range(40)}
    worst.update({second: 3.0 for second in range(20, 26)})
    assert delays_back_under(worst, 1.0, 20.0) == 6.0
    assert delays_back_under({**worst, 30: 2.0}, 1.0, 20.0) == 11.0
    assert delays_back_under({**worst, 39: 2.0}, 1.0, 20.0) is None


def test_history_spreads_over_the_span_it_is_given(tmp_path: Path) -> None:
    """``--span`` stands for a shorter retention: the delivered history finished within the span before the build,
    the failed within seven times it."""
    store = f"sqlite:///{tmp_path / 'aged.db'}"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_"))}
    started = time.time()
    built = subprocess.run([sys.executable, str(BENCH / "bench_message_log.py"), "--build-only", "--kept", "3000",
                            "--span", "600", "--store", store], capture_output=True, text=True, timeout=240, env=env,
                           cwd=BENCH.parent)
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    from sqlalchemy import create_engine

    from prefect_webhooks.store.log.partitions import kept_partitions

    with create_engine(store).connect() as connection:
        for kind, span in (("delivered", 600), ("failed", 4200)):
            oldest, newest = zip(*(connection.exec_driver_sql(
                f"SELECT min(finished_ms), max(finished_ms) FROM {partition.name}").one()
                for partition in kept_partitions(connection, kind)), strict=True)
            assert started - span - 5 <= min(oldest) / 1000 < started - span / 2, kind
            assert max(newest) / 1000 <= time.time(), kind


def test_the_capacity_check_waits_for_outcomes_the_receiver_has_before_the_store(store_url: str) -> None:
    """The receiver can hold a batch before its outcomes commit; the step's store check waits for them, and still
    reports what stays pending once the store stops changing."""
    import threading

    from prefect_webhooks.messages.outcomes import Attempt, Delivered, OutcomeRecords
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import enqueue, record_outcomes
    from prefect_webhooks.store.schema.tables import store_now

    sys.path.insert(0, str(BENCH))
    try:
        from bench_stores import settled_store_counts, store_counts
    finally:
        sys.path.remove(str(BENCH))
    engine = get_engine(store_url)
    enqueue("crm", [{"version": 1, "type": "track", "userId": f"u{n}", "event": "E"} for n in range(3)])
    assert settled_store_counts(store_url, {"delivered": 3}, 0.6) == {"pending": 3}

    def record_late() -> None:
        time.sleep(1.0)
        now = store_now()
        record_outcomes(engine, OutcomeRecords(
            delivered=[Delivered(n, attempts=1, first_attempt_at=now, at=now, destination="crm") for n in (1, 2, 3)],
            attempts=[Attempt(n, now, "http://a/", 200, None, 1.0, "delivered") for n in (1, 2, 3)]))

    recorder = threading.Thread(target=record_late)
    recorder.start()
    assert store_counts(store_url) == {"pending": 3}
    assert settled_store_counts(store_url, {"delivered": 3}, 3.0) == {"delivered": 3}
    recorder.join()


def test_cold_lookups_run_beside_warm_ones_on_a_built_store(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'aged.db'}"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_"))}
    built = subprocess.run([sys.executable, str(BENCH / "bench_message_log.py"), "--build-only", "--kept", "3000",
                            "--store", store], capture_output=True, text=True, timeout=240, env=env, cwd=BENCH.parent)
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    done = subprocess.run([sys.executable, str(BENCH / "bench_cold_lookups.py"), "--store", store, "--probes", "5",
                           "--rounds", "1"], capture_output=True, text=True, timeout=240, env=env, cwd=BENCH.parent)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert re.search(r"a random 4 KiB read of the evicted file: [\d.]+ ms(.|\n)*round 1, cold, the file evicted: "
                     r"p50 [\d.]+ ms, p99 [\d.]+ ms(.|\n)*round 1, reference, warm: the same users again: p50 [\d.]+ "
                     r"ms, p99 [\d.]+ ms", done.stdout), done.stdout


def test_the_profile_breakdown_splits_samples_into_c_and_python(tmp_path: Path) -> None:
    raw = tmp_path / "worker.raw"
    loop = "Runner.run (asyncio/runners.py:118)"
    raw.write_text(
        f"{loop};CurlTransport._act (prefect_webhooks/delivery/sending/transport.py:361) 6\n"
        f"{loop};CurlTransport._watch_socket (prefect_webhooks/delivery/sending/transport.py:336) 2\n"
        f"{loop} 1\n"
        "_worker (concurrent/futures/thread.py:83);record_outcomes (prefect_webhooks/store/queue/outbox.py:368);"
        "GatedCursor._in_turn (prefect_webhooks/store/engine/write_gate.py:122) 1\n"
    )
    done = subprocess.run([sys.executable, str(BENCH / "profile_breakdown.py"), str(raw)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "60.0 %  libcurl" in done.stdout and "20.0 %  transport: Python" in done.stdout
    assert "10.0 %  event loop's own C" in done.stdout and "10.0 %  SQLite (C)" in done.stdout
    assert "in C (the floor of this design): 80.0 %; Python: 20.0 %" in done.stdout


def test_a_reference_checkout_without_its_flows_linked_is_refused_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "prefect_webhooks").mkdir()
    sys.path.insert(0, str(BENCH))
    try:
        from bench_capacity import check_serve_root
    finally:
        sys.path.remove(str(BENCH))
    with pytest.raises(SystemExit, match=r"no flows or deployments; link .*ln -s \.\./flows"):
        check_serve_root(tmp_path)
    (tmp_path / "prefect_webhooks" / "flows").mkdir()
    (tmp_path / "prefect_webhooks" / "deployments").mkdir()
    check_serve_root(tmp_path)
