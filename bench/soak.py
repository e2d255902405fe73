"""``python -m bench.soak [--minutes 60] [--rate 2000] [--max-delay 600] [--kill-every 10]``:
the bridge for an hour on the three-broker cluster, SIGKILLed every ten minutes.

A steady load (``--rate`` records/s, due 1 s to ``--max-delay`` s after they are produced, as
absolute times) on a cluster of its own (``scripts/services up kafka-cluster``, RF 3,
min.insync.replicas 2) and a Redis of its own, one bridge with its default configuration as a
static group member, SIGKILLed and started again every ``--kill-every`` minutes. Before the load,
a preload puts the backlog the steady load keeps (rate x the mean delay, due over the next
``--max-delay`` seconds as that backlog would be), so Redis holds a steady backlog from the first
minutes instead of filling for ``--max-delay`` seconds.

Every minute: the bridge's RSS and CPU, Redis's ``used_memory`` and CPU, the records delivered
and the lateness (the target topic's ``LogAppendTime`` minus the due time the load asked) of the
records due in that minute; beside them the machine's own state, a baseline measured in the same
run (:class:`Machine`): its busy cores, the time stolen by the host, and a fixed piece of work's
CPU time. After the load, it waits for every record to be delivered: the ones
never delivered are lost, the ones delivered before their due time early. Writes
``build/soak/results.json`` and ``build/soak/soak.png``; exits 1 if a record was lost, early or
dead-lettered, or a target was missed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from confluent_kafka import Consumer, Message

from bench.scenarios import ACK_STAMPS
from bridge.message import H_DELIVER_AT, H_DUE_AT, H_TARGET_TOPIC, Headers
from tests.chaos.background import Background
from tests.chaos.scenarios import Run
from tests.chaos.servers import STATE_DIR, Servers
from tests.chaos.workload import CLIENT_LOG_LEVEL, Record, Workload, now_ms, seq_of
from tests.conftest import ROOT
from tests.integration.harness import Bridge, wait_ready

# Ports and state of its own: a soak runs for an hour and must not meet `make test`'s chaos
# servers (19192, 16479 and the cluster on 19292).
KAFKA_PORT, REDIS_PORT = 19392, 16679
PRELOAD_RATE = 5000.0  # records/s
MIN_DELAY_MS = 1000
WARM_UP_MIN = 5  # the targets are checked on the minutes after this
FLAT = 0.05  # RSS and Redis memory within 5% of their median after the warm-up
TREND = 1.10  # CPU per record and p99: the last third at most 10% over the first third


def _spread(i: int) -> float:
    """A fixed pseudo-random fraction in [0, 1) for record ``i`` (Knuth's multiplicative
    hash): the same on every read, so the due time of a seq is known without storing it."""
    return ((i * 2654435761) & 0xFFFFFFFF) / 2**32


@dataclass
class Load:
    """The records of the soak, made when the workload asks for them: seq ``i < preload`` is the
    preload (produced at ``preload_rate`` from ``start_ms``), the rest the steady load (at
    ``rate`` from ``steady_start_ms``, set when it starts)."""

    target: str
    start_ms: int
    preload: int
    steady: int
    rate: float
    max_delay_ms: int
    preload_rate: float = PRELOAD_RATE
    steady_start_ms: int = 0

    def __len__(self) -> int:
        return self.preload + self.steady

    def due_ms(self, i: int) -> int:
        """When record ``i`` is due. The steady load's: its produce time as paced plus a delay
        uniform in MIN_DELAY_MS..max_delay_ms. The preload's: the end of the preload plus a wait
        with the density of a steady backlog's remaining waits (falling linearly to
        ``max_delay_ms``), so the backlog is the steady one when the steady load starts."""
        r = _spread(i)
        if i < self.preload:  # waiting from the end of the preload, as if produced at once
            return int(self.start_ms + self.preload * 1000 / self.preload_rate
                       + self.max_delay_ms * (1 - (1 - r) ** 0.5))  # fmt: skip
        produced = self.steady_start_ms + (i - self.preload) * 1000 / self.rate
        return int(produced + MIN_DELAY_MS + r * (self.max_delay_ms - MIN_DELAY_MS))

    def record(self, i: int) -> Record:
        headers: Headers = [
            (H_TARGET_TOPIC, self.target.encode()),
            (H_DELIVER_AT, b"%d" % self.due_ms(i)),
        ]
        return Record(headers, key=b"k%d" % (i % 997))


class Records(Sequence[Record]):
    """``load``'s records ``first``..``first + count`` for a :class:`Workload`, made one at a
    time (the hour's eight million would not fit in memory as objects)."""

    def __init__(self, load: Load, first: int, count: int) -> None:
        self.load, self.first, self.size = load, first, count

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, i: int) -> Record: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Record]: ...
    def __getitem__(self, i: int | slice) -> Record | Sequence[Record]:
        if isinstance(i, slice):
            raise TypeError("Records are made one at a time")
        if not 0 <= i < self.size:
            raise IndexError(i)
        return self.load.record(self.first + i)


@dataclass
class Tally(Background):
    """Reads the target topic and the DLQ from their start in a thread, counting each seq's
    deliveries and binning the first one's lateness by the minute it was due."""

    bootstrap: str
    target: str
    dlq: str
    load: Load
    seen: bytearray = field(init=False)
    dead: int = 0
    early: list[int] = field(default_factory=list)
    wrong_due: int = 0  # delivered with a due-at header other than the load asked for
    duplicates: int = 0
    delivered: int = 0
    lateness: dict[int, collections.Counter[int]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    delivered_in: collections.Counter[int] = field(default_factory=collections.Counter)
    thread_name = "tally"

    def __post_init__(self) -> None:
        self.seen = bytearray(len(self.load))

    def _run(self) -> None:
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": f"soak-tally-{self.target}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "log_level": CLIENT_LOG_LEVEL,
        })  # fmt: skip
        consumer.subscribe([self.target, self.dlq])
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(1000, 0.2):
                    if msg.error() is None:
                        self._take(msg)
        finally:
            consumer.close()

    def _take(self, msg: Message) -> None:
        seq = seq_of(msg.value())
        if msg.topic() == self.dlq or seq is None or not 0 <= seq < len(self.seen):
            self.dead += 1
            return
        if self.seen[seq]:
            self.duplicates += 1
            return
        self.seen[seq] = 1
        self.delivered += 1
        due = self.load.due_ms(seq)
        header = dict(msg.headers() or []).get(H_DUE_AT)
        if header is None or int(header) != due:
            self.wrong_due += 1
        appended = msg.timestamp()[1]
        late = appended - due
        if late < 0:
            self.early.append(seq)
        self.lateness[(due - self.load.start_ms) // 60_000][max(0, late)] += 1
        self.delivered_in[(appended - self.load.start_ms) // 60_000] += 1

    def missing(self) -> int:
        return len(self.seen) - self.delivered


def quantile(counts: collections.Counter[int], q: float) -> int:
    """The ``q`` quantile (nearest rank) of the values ``counts`` holds; 0 for none."""
    total = sum(counts.values())
    rank, seen = min(total - 1, int(q * total)), 0
    for value in sorted(counts):
        seen += counts[value]
        if seen > rank:
            return value
    return 0


PROBE_LOOPS = 300_000  # ~12 ms of pure Python on this machine


def probe_ms() -> float:
    """The CPU time of a fixed piece of pure-Python work, the least of five tries: the speed of
    this machine's cores right now (another guest on the same host slows them), in milliseconds.
    Thread CPU time, so waiting for the GIL or a core does not count."""
    best = float("inf")
    for _ in range(5):
        started, x = time.thread_time(), 0
        for i in range(PROBE_LOOPS):
            x += i * i
        best = min(best, time.thread_time() - started)
    return best * 1000


def _cpu_ticks() -> list[int]:
    """user, nice, system, idle, iowait, irq, softirq, steal of all cores (/proc/stat)."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


@dataclass
class Machine:
    """The machine's state over each minute, a baseline measured in the same run for the bridge's
    figures: the cores busy (of ``os.cpu_count()``), the cores' time the host gave to others
    (steal), and :func:`probe_ms`. A slower host shows in all of the bridge's timings at once."""

    last: list[int] = field(default_factory=_cpu_ticks)

    def sample(self) -> dict[str, float]:
        now = _cpu_ticks()
        delta = [b - a for a, b in zip(self.last, now, strict=True)]
        self.last = now
        share = (os.cpu_count() or 1) / (sum(delta) or 1)
        idle, steal = delta[3] + delta[4], delta[7]
        return {
            "machine_busy_cores": (sum(delta) - idle - steal) * share,
            "machine_steal_cores": steal * share,
            "probe_ms": probe_ms(),
        }


@dataclass
class Meter:
    """The bridge's CPU seconds across its lives (a SIGKILLed one's last reading kept)."""

    dead_cpu_s: float = 0.0

    @staticmethod
    def cpu_s(bridge: Bridge) -> float:
        assert bridge.proc is not None
        fields = Path(f"/proc/{bridge.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def total(self, bridge: Bridge) -> float:
        return self.dead_cpu_s + self.cpu_s(bridge)

    def kill(self, bridge: Bridge) -> None:
        self.dead_cpu_s += self.cpu_s(bridge)
        bridge.kill()


def soak(servers: Servers, out: Path, *, minutes: float, rate: float, max_delay_s: float,
         kill_every_min: float) -> dict[str, Any]:  # fmt: skip
    servers.kafka_cluster_up()
    run = Run(servers, out / "runs", "soak", label="soak", target_config=ACK_STAMPS, watch=False,
              # What a user gets: the bridge's own group session and lease.
              overrides={"kafka__consumer": {}, "egress__lease": "30s"})  # fmt: skip
    redis = servers.redis()
    meter = Meter()
    try:
        max_delay_ms = int(max_delay_s * 1000)
        preload = int(rate * (MIN_DELAY_MS + max_delay_ms) / 2000)
        load = Load(run.target, now_ms() + 2000, preload, int(rate * minutes * 60), rate,
                    max_delay_ms)  # fmt: skip
        bridge = run.bridge("pod-0")
        wait_ready(bridge)
        tally = Tally(servers.bootstrap, run.target, run.dlq, load).start()
        time.sleep(max(0.0, (load.start_ms - now_ms()) / 1000))  # the load's start time
        first = Workload(servers.bootstrap, run.delay, Records(load, 0, preload), PRELOAD_RATE)
        steady = Workload(servers.bootstrap, run.delay, Records(load, preload, load.steady), rate,
                          first_seq=preload)  # fmt: skip

        def begin() -> None:  # the steady load as soon as the preload is in
            first.join(preload / PRELOAD_RATE * 3 + 60)
            load.steady_start_ms = now_ms()
            steady.start()

        first.start()
        started = time.monotonic()
        starter = threading.Thread(target=begin, name="steady", daemon=True)
        starter.start()
        rows: list[dict[str, Any]] = []
        kills: list[int] = []
        cpu, redis_cpu, machine = meter.total(bridge), _redis_cpu(redis), Machine()
        end_min = int(preload / PRELOAD_RATE / 60 + minutes) + 1
        born = 0  # the minute mark the bridge running now was started at
        for minute in range(1, end_min + 1):
            time.sleep(max(0.0, started + minute * 60 - time.monotonic()))  # the minute mark
            now_cpu, now_redis_cpu = meter.total(bridge), _redis_cpu(redis)
            rows.append({
                "minute": minute, "age_min": minute - born, "rss_bytes": bridge.memory(),
                "anon_bytes": bridge.memory("RssAnon"),
                "redis_used_bytes": _redis_info(redis, "memory", "used_memory"),
                "bridge_cpu_s": now_cpu - cpu, "redis_cpu_s": now_redis_cpu - redis_cpu,
                **machine.sample(),
            })  # fmt: skip
            cpu, redis_cpu = now_cpu, now_redis_cpu
            print(f"   minute {minute}: {rows[-1]}", file=sys.stderr, flush=True)
            if minute % kill_every_min == 0 and minute < end_min:
                meter.kill(bridge)
                kills.append(now_ms())
                bridge, born = run.bridge("pod-0"), minute
        starter.join(60)
        steady.join(600)
        deadline = time.monotonic() + max_delay_s + 120
        while tally.missing() and time.monotonic() < deadline:
            time.sleep(1)  # polling the tally, with a deadline
        time.sleep(2)  # duplicates still in flight
        tally.stop()
        return _results(load, tally, rows, kills, first.failed + steady.failed,
                        minutes=minutes, rate=rate, max_delay_s=max_delay_s,
                        kill_every_min=kill_every_min)  # fmt: skip
    finally:
        redis.close()
        run.close()
        servers.kafka_cluster_down()


def _redis_info(client: Any, section: str, key: str) -> int:
    return int(client.info(section)[key])


def _redis_cpu(client: Any) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _results(load: Load, tally: Tally, rows: list[dict[str, Any]], kills: list[int],
             failed: list[str], **args: float) -> dict[str, Any]:  # fmt: skip
    for row in rows:
        m = row["minute"] - 1  # the minute that ended at the mark
        lateness = tally.lateness.get(m, collections.Counter())
        delivered = tally.delivered_in.get(m, 0)
        row.update(delivered=delivered, due=sum(lateness.values()),
                   p99_ms=quantile(lateness, 0.99), max_ms=max(lateness, default=0),
                   killed=any(load.start_ms + m * 60_000 <= k < load.start_ms + (m + 1) * 60_000
                              for k in kills))  # fmt: skip
        for who in ("bridge", "redis"):  # none in the preload's minutes: nothing is due yet
            cpu_ms = row[f"{who}_cpu_s"] * 1000
            row[f"{who}_cpu_ms_per_record"] = cpu_ms / delivered if delivered else None
    overall: collections.Counter[int] = collections.Counter()
    for counts in tally.lateness.values():
        overall.update(counts)
    results = {
        "command": "make soak", "args": args, "commit": _commit(), "records": len(load),
        "preload": load.preload,
        "lost": tally.missing(), "early": len(tally.early), "early_seqs": tally.early[:20],
        "dead_lettered": tally.dead, "wrong_due_header": tally.wrong_due,
        "duplicates": tally.duplicates, "workload_failed": failed[:5], "kills": len(kills),
        "p99_ms": quantile(overall, 0.99), "max_ms": max(overall, default=0), "minutes": rows,
    }  # fmt: skip
    results["targets"] = targets(results)
    return results


def _commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False)  # fmt: skip
    return proc.stdout.strip()


def _flat(values: list[float]) -> float | None:
    """The largest distance from the median, as a fraction of it (None: no values)."""
    if not values:
        return None
    median = sorted(values)[len(values) // 2]
    return max(abs(v - median) for v in values) / median if median else 0.0


def _trend(values: list[float]) -> float | None:
    """The median of the last third over the median of the first third (None: too few values).
    Medians: one disturbed minute must not make a trend, nor hide one."""
    if len(values) < 3:
        return None
    third = len(values) // 3
    first = statistics.median(values[:third])
    return statistics.median(values[-third:]) / first if first else 0.0


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, measured, met): memory flat after the warm-up (the bridge's RSS once the process
    running is WARM_UP_MIN minutes old: a process started again after a kill grows back first;
    the last minute, when the load ends, left out), CPU per record and p99 without a trend
    (minutes without a kill, the last one left out), nothing lost, early or dead-lettered. A run
    too short to judge a target misses it."""
    after = [r for r in results["minutes"] if r["minute"] > WARM_UP_MIN]
    calm = _calm(results)
    old = [r["rss_bytes"] for r in results["minutes"] if r["age_min"] > WARM_UP_MIN]
    out = [
        _judged(f"bridge RSS within {FLAT:.0%} of its median (processes over {WARM_UP_MIN} min "
                "old)", _flat(old), FLAT, "{:.1%}"),
        _judged(f"Redis used_memory within {FLAT:.0%} of its median after minute {WARM_UP_MIN}",
                _flat([r["redis_used_bytes"] for r in after[:-1]]), FLAT, "{:.1%}"),
    ]  # fmt: skip
    for key, name in (("bridge_cpu_ms_per_record", "bridge CPU per record"),
                      ("p99_ms", "lateness p99 per minute")):  # fmt: skip
        trend = _trend([float(r[key]) for r in calm])
        out.append(_judged(f"{name}: last third / first third <= {TREND:.2f} (minutes without a "
                           "kill)", trend, TREND, "{:.2f}"))  # fmt: skip
    bad = sum(results[k] for k in ("lost", "early", "dead_lettered", "wrong_due_header"))
    out.append(("0 lost, 0 early, 0 dead-lettered, due-at as asked", str(bad), bad == 0))
    return out


def _calm(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The minutes the trends compare: after the warm-up, without a kill, not the last."""
    after = [r for r in results["minutes"] if r["minute"] > WARM_UP_MIN]
    return [r for r in after[:-1] if not r["killed"]]


def _judged(target: str, value: float | None, limit: float, fmt: str) -> tuple[str, str, bool]:
    if value is None:
        return target, "too short to judge", False
    return target, fmt.format(value), value <= limit


def plot(results: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["minutes"]
    t = [r["minute"] for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    mib = 1 << 20
    axes[0].plot(t, [r["rss_bytes"] / mib for r in rows], label="bridge RSS")
    axes[0].plot(t, [r["redis_used_bytes"] / mib for r in rows], label="Redis used_memory")
    axes[0].set(ylabel="MiB", title="Memory")
    delivering = [r for r in rows if r["delivered"]]
    for who, label in (("bridge", "bridge"), ("redis", "Redis")):
        axes[1].plot([r["minute"] for r in delivering],
                     [r[f"{who}_cpu_ms_per_record"] for r in delivering], label=label)  # fmt: skip
    axes[1].set(ylabel="CPU ms / record", title="CPU per record delivered")
    axes[2].plot(t, [r["p99_ms"] for r in rows], label="p99")
    axes[2].set_yscale("log")
    axes[2].set(ylabel="ms (log)", title="Lateness of the records due in the minute")
    axes[3].plot(t, [r["delivered"] for r in rows], label="delivered")
    axes[3].set(ylabel="records", xlabel="minute", title="Records delivered per minute")
    for ax in axes:
        for r in rows:
            if r["killed"]:
                ax.axvline(r["minute"], color="tab:red", lw=0.6, ls=":")
        ax.legend(loc="upper right")
    fig.suptitle(f"Soak: {results['args']['rate']:.0f} records/s, SIGKILL every "
                 f"{results['args']['kill_every_min']:.0f} min (red), three brokers")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def report(results: dict[str, Any]) -> str:
    """Markdown: the targets, the totals, and one row per minute."""
    a = results["args"]
    lines = [
        f"# Soak: {a['minutes']:.0f} min at {a['rate']:,.0f} records/s, delays 1 s to "
        f"{a['max_delay_s']:.0f} s, SIGKILL every {a['kill_every_min']:.0f} min",
        "",
        f"`{results['command']}` at {results.get('commit', '?')}: {results['records']:,} records "
        f"({results['preload']:,} of them the preload), {results['kills']} kills; lost "
        f"{results['lost']}, early {results['early']}, dead-lettered {results['dead_lettered']}, "
        f"duplicates {results['duplicates']:,}; lateness p99 {results['p99_ms']:,} ms, max "
        f"{results['max_ms']:,} ms.",
        "",
        "| target | measured | met |",
        "|---|---|---|",
        *(f"| {t} | {m} | {'yes' if ok else '**no**'} |" for t, m, ok in results["targets"]),
        "",
        *_anon(results),
        *_machine(results),
        "| minute | bridge age (min) | bridge RSS MiB | Redis used MiB | bridge CPU ms/record | "
        "Redis CPU ms/record | delivered | due | p99 ms | max ms | killed | busy cores | "
        "steal cores | probe ms |",
        "|" + "---|" * 14,
    ]
    mib = 1 << 20
    for r in results["minutes"]:
        lines.append(
            f"| {r['minute']} | {r['age_min']} | {r['rss_bytes'] / mib:.1f} | "
            f"{r['redis_used_bytes'] / mib:.1f} | {_ms(r['bridge_cpu_ms_per_record'])} | "
            f"{_ms(r['redis_cpu_ms_per_record'])} | {r['delivered']:,} | {r['due']:,} | "
            f"{r['p99_ms']:,} | {r['max_ms']:,} | {'yes' if r['killed'] else ''} | "
            f"{_fixed(r.get('machine_busy_cores'), 2)} | "
            f"{_fixed(r.get('machine_steal_cores'), 3)} | {_fixed(r.get('probe_ms'), 1)} |"
        )
    return "\n".join(lines) + "\n"


def _machine(results: dict[str, Any]) -> list[str]:
    """The machine's baseline over the minutes the trends compare, when the run recorded it."""
    calm = [r for r in _calm(results) if "probe_ms" in r]
    if len(calm) < 3:
        return []
    third = len(calm) // 3

    def thirds(key: str, digits: int) -> str:
        first = statistics.median(r[key] for r in calm[:third])
        last = statistics.median(r[key] for r in calm[-third:])
        return f"{first:.{digits}f} → {last:.{digits}f}"

    return [f"The machine over the same minutes, medians of the first and last third (a baseline "
            f"measured in the same run, not a target): probe {thirds('probe_ms', 1)} ms (a fixed "
            f"piece of pure-Python work's CPU time: the host's speed), busy cores "
            f"{thirds('machine_busy_cores', 2)} of {os.cpu_count()}, steal "
            f"{thirds('machine_steal_cores', 3)} cores.", ""]  # fmt: skip


def _fixed(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _anon(results: dict[str, Any]) -> list[str]:
    """The RSS target's reading without file-backed pages (RssAnon), when the run recorded it."""
    old = [r["anon_bytes"] for r in results["minutes"]
           if r["age_min"] > WARM_UP_MIN and "anon_bytes" in r]  # fmt: skip
    spread = _flat([float(v) for v in old]) if old else None
    if spread is None:
        return []
    return [f"Bridge RSS without file-backed pages (RssAnon: the heap, not the shared libraries' "
            f"code, which the kernel may evict and load again): {spread:.1%} from its median, "
            f"{min(old) / (1 << 20):.1f} to {max(old) / (1 << 20):.1f} MiB.", ""]  # fmt: skip


def _ms(value: float | None) -> str:
    return "" if value is None or value > 1000 else f"{value:.3f}"  # > 1 s: no record delivered


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--max-delay", type=float, default=600, help="seconds")
    parser.add_argument("--kill-every", type=float, default=10, help="minutes")
    parser.add_argument("--report", type=Path, metavar="RESULTS_JSON",
                        help="write report.md and soak.png again from a run's results")  # fmt: skip
    args = parser.parse_args()
    out = ROOT / "build" / "soak"
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        results = json.loads(args.report.read_text())
        results["targets"] = targets(results)
    else:
        servers = Servers(STATE_DIR / "soak", kafka_port=KAFKA_PORT, redis_port=REDIS_PORT)
        servers.up("redis")
        try:
            results = soak(servers, out, minutes=args.minutes, rate=args.rate,
                           max_delay_s=args.max_delay, kill_every_min=args.kill_every)  # fmt: skip
        finally:
            servers.down()
        (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "soak.png")
    (out / "report.md").write_text(report(results))
    print(report(results).split("\n\n| minute")[0])
    print(f"{out / 'results.json'}, {out / 'report.md'}, {out / 'soak.png'}")
    return 0 if all(met for _, _, met in results["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
