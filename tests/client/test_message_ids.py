"""messageIds: random version-4 UUID strings, unique across threads and forked processes."""

from __future__ import annotations

import os
import threading
import uuid

from prefect_webhooks.client.message_ids import new_message_id


def test_ids_are_version_4_uuids_in_their_usual_text_form() -> None:
    ids = [new_message_id() for _ in range(5_000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


def test_threads_never_share_ids() -> None:
    found: list[list[str]] = [[] for _ in range(8)]

    def take(slot: int) -> None:
        found[slot].extend(new_message_id() for _ in range(2_000))

    threads = [threading.Thread(target=take, args=(slot,)) for slot in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [text for slot in found for text in slot]
    assert len(set(every)) == len(every) == 16_000


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_message_id()  # the pool is filled: a child that kept it would hand out the parent's next ids
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        os.write(write, "\n".join(new_message_id() for _ in range(300)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split("\n")
    os.waitpid(pid, 0)
    parent = [new_message_id() for _ in range(300)]
    assert len(child) == 300 and not set(child) & set(parent)
