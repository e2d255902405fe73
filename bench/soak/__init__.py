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
run: its busy cores, the time stolen by the host, and a fixed piece of work's CPU time. After the
load, it waits for every record to be delivered: the ones never delivered are lost, the ones
delivered before their due time early. Writes ``build/soak/results.json``, ``report.md`` and
``soak.png``; exits 1 if a record was lost, early or dead-lettered, or a target was missed.

The package: :mod:`.load` the records, :mod:`.tally` what was delivered, :mod:`.meters` the
bridge's CPU and the machine's state, :mod:`.run` the hour, :mod:`.judge` the targets,
:mod:`.report` the report and plot; ``python -m bench.soak`` (:mod:`.__main__`) runs it.
"""
