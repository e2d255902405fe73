"""The claim path through the bridge, with and without delay-ids: records stored, then all due.

    python -m bench.claim_path [--records N] [--ids-only] [--label L]

A bridge on the local services stores N records of 100 B (without a delay-id, then each with a
31-byte delay-id of its own), all due at one instant 45 s after they were produced; once every
one is stored, it is measured from the first acknowledgement to the last. Prints a JSON line per
kind: the acknowledgement rate, and how long after the due instant the first came.

Run it from two checkouts, one after the other and back, to compare code with code: single runs
here vary by a third (docs/bench/history.md, "The claim path with ids").
"""

from __future__ import annotations

import argparse
import json
import time

from bench.local import local_servers
from bench.scenarios import ACK_STAMPS, Progress, finished, produce
from bridge.message import H_DELIVER_AT, H_ID, H_TARGET_TOPIC, Headers
from bridge.store import Store
from testbed.run import Run
from testbed.services import ROOT
from testbed.workload import Record

DUE_AFTER_MS = 45_000  # every record stored before it falls due
ID_BYTES = 31


def claim_path(count: int, with_ids: bool, label: str) -> dict[str, object]:
    """One run of ``count`` records (each with a delay-id if ``with_ids``); its figures."""
    servers = local_servers()
    servers.up()
    kind = "ids" if with_ids else "plain"
    run = Run(
        servers,
        ROOT / "build" / "bench" / "runs",
        f"claim-{kind}",
        label="bench",
        target_config=ACK_STAMPS,
        watch=False,
    )
    store = Store(servers.redis(), run.prefix)
    try:
        due = int(time.time() * 1000) + DUE_AFTER_MS
        header: Headers = [(H_TARGET_TOPIC, run.target.encode()), (H_DELIVER_AT, b"%d" % due)]

        def headers(i: int) -> Headers:
            own = (b"order-%d" % i).rjust(ID_BYTES, b"0")
            return [*header, (H_ID, own)] if with_ids else header

        records = [Record(headers(i), key=b"k%d" % (i % 997)) for i in range(count)]
        progress = Progress(store, run.delay).start()
        bridge = run.bridge()
        finished(produce(run, records, float("inf"), value_size=100))
        progress.wait(lambda i, s: i >= count and s == count, 120, "all stored")
        if time.time() * 1000 > due - 1000:
            raise RuntimeError("stored too late to measure from the due instant: fewer records")
        progress.wait(lambda i, s: i >= count and s == 0, 300, "all acknowledged")
        progress.stop()
        bridge.stop()
        first = progress.first(lambda i, s: i - s > 0)
        last = progress.first(lambda i, s: i >= count and s == 0)
        return {
            "label": label,
            "kind": kind,
            "acked_per_s": round(count / max(1e-3, (last - first) / 1000)),
            "first_ack_after_due_ms": first - due,
        }
    finally:
        store.client.close()
        run.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--ids-only", action="store_true", help="only the records with ids")
    parser.add_argument("--label", default="", help="names the code in the output")
    args = parser.parse_args()
    for with_ids in [True] if args.ids_only else [False, True]:
        print(json.dumps(claim_path(args.records, with_ids, args.label)), flush=True)


if __name__ == "__main__":
    main()
