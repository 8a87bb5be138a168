"""The ingest API's group commit alone: CPU per commit of a group of one call, the case of a client that sends its
calls one request at a time (nothing to group them with), against the CPU reference.

    .venv/bin/python bench/bench_group_commit.py [--commits 500] [--rounds 5] [--calls 1]

Each commit is ``commit_batches`` of one prepared batch (an SDK-shaped ``track`` call) in its own transaction on a
fresh SQLite store, as ``BatchWriter`` writes it: the dedupe lookup and insert, the suppression check, the queue
insert, the commit. The calls are prepared (validated, routed) before the clock starts. The best of ``--rounds``
rounds is printed; run it in another checkout (``cd`` there) for the code before.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from cpu_accounting import cpu_reference  # noqa: E402
from load_generator import make_batch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=500, help="commits per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1, help="calls per commit")
    args = parser.parse_args()
    os.environ["PREFECT_WEBHOOKS_DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix='bench-group-commit-')}/s.db"
    import orjson

    from prefect_webhooks.inbound.ingestion import commit_batches, prepare_batch
    from prefect_webhooks.inbound.sources import SourceInfo
    from prefect_webhooks.store.engine.engines import get_engine

    source = SourceInfo(name="web", destinations=("crm",))
    warm_up = args.commits
    bodies = [orjson.loads(make_batch("bench", 0, n * args.calls, args.calls, time.time()))
              for n in range(warm_up + args.commits * args.rounds)]
    prepared = [prepare_batch(body["batch"], source, sent_at=body["sentAt"]) for body in bodies]
    engine = get_engine()

    def commit(batches: list) -> None:
        for batch in batches:
            with engine.begin() as connection:
                commit_batches(connection, [batch])

    commit(prepared[:warm_up])
    rounds = []
    for number in range(args.rounds):
        start = warm_up + number * args.commits
        started = time.process_time()
        commit(prepared[start:start + args.commits])
        rounds.append((time.process_time() - started) / args.commits * 1e6)
    print(f"group commit of {args.calls} call(s), SQLite, fresh store: best {min(rounds):.1f} µs a commit "
          f"(rounds: {', '.join(f'{value:.0f}' for value in rounds)}); {cpu_reference()}")


if __name__ == "__main__":
    main()
