"""Where a process's CPU goes, by kind of work: a py-spy raw profile split into the C it calls and the Python around it.

    py-spy record -p PID -r 100 -d 30 -f raw -o worker.raw --nonblocking
    .venv/bin/python bench/profile_breakdown.py worker.raw

A sample's kind is read from its innermost frame: py-spy shows time inside a C call (libcurl's ``socket_action``,
SQLite's ``execute``, zlib, the event loop's own C) as the Python line that made the call. What is left when every
Python frame of ours is gone is the floor of this design: the C parts and the kernel calls they make. Idle threads are
not sampled (no ``--idle``); a thread parked in a C wait py-spy cannot tell from work shows as "thread hand-off".
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

# (kind, is it C, test on the innermost frame, test on the whole stack); the first that matches decides.
KINDS: list[tuple[str, bool, tuple[str, ...], tuple[str, ...]]] = [
    ("libcurl: socket_action (C, with its send/recv)", True, ("CurlTransport._act (prefect_webhooks/delivery/sending/"
                                                             "transport.py:361)",), ()),
    ("event loop's own C (uvloop, epoll)", True, ("Runner.run (", "run (uvloop", "EpollSelector.select"), ()),
    ("SQLite (C): statements, commits, checkpoints", True,
     ("GatedCursor._in_turn", "GatedConnection._ending", "Checkpointer._run"), ()),
    ("record compression (zlib, C)", True, ("pack_fields (prefect_webhooks/store/log/records.py:132)",), ()),
    ("HMAC signing (C)", True, ("HMAC.",), ()),
    ("JSON (orjson, C)", True, ("parse_json",), ()),
    ("thread hand-off and waits", False, ("_worker (concurrent", "Condition.wait", "Thread._wait_for_tstate",
                                          "_chain_future"), ()),
    ("Prefect (shift starts, heartbeats)", False, (), ("(prefect/",)),
    ("recording outcomes: Python", False, (), ("record_outcomes",)),
    ("ingest: group commit, Python", False, (), ("BatchWriter._write",)),
    ("ingest: validation and routing, Python", False, (), ("prepare_batch",)),
    ("HTTP server (uvicorn, starlette, fastapi)", False, (), ("uvicorn/", "starlette/", "fastapi/")),
    ("claims: Python", False, (), ("claim_due_deliveries",)),
    ("transport: Python around libcurl", False, (), ("sending/transport.py",)),
    ("sender: slots, circuit, results, signing", False, (), ("sending/", "pacing/")),
]


def breakdown(raw: Path) -> tuple[int, Counter[str], set[str]]:
    """Samples in all, samples by kind, and the kinds that are C."""
    total, kinds, c_kinds = 0, Counter[str](), {kind for kind, is_c, *_ in KINDS if is_c}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        for kind, _is_c, leaf_starts, stack_holds in KINDS:
            if frames[-1].startswith(leaf_starts) if leaf_starts else any(part in stack for part in stack_holds):
                kinds[kind] += int(count)
                break
        else:
            kinds["other Python"] += int(count)
    return total, kinds, c_kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, help="py-spy record -f raw output")
    args = parser.parse_args()
    total, kinds, c_kinds = breakdown(args.raw)
    print(f"{args.raw.name}: {total} active samples")
    for kind, count in kinds.most_common():
        print(f"  {count / total * 100:5.1f} %  {kind}")
    in_c = sum(kinds[kind] for kind in c_kinds)
    share = in_c / total * 100
    print(f"  in C (the floor of this design): {share:.1f} %; Python: {100 - share:.1f} %")


if __name__ == "__main__":
    main()
