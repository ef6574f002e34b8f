"""The real-traffic lab: the real product on a real (namespaced) network with real traffic.

Where :mod:`skewd.lab.sim` simulates a cluster, this one runs it: network namespaces on a
bridge (:mod:`.topology`), a collective rank per node doing torch.distributed gloo all-reduces
over TCP (or a plain ring all-reduce where torch is absent; :mod:`.workers.rank`), token
streams from a client to every node (:mod:`.workers.tokens`), a JetStream nats-server, one
``skewd controller`` and one ``skewd agent`` per node with default configs (:mod:`.product`),
faults made by real means at a scripted time (:mod:`.faults`), seeded scenarios
(:mod:`.scenario`), every skewd message recorded (:mod:`.workers.recorder`) and scored against
the run's truth.json (:mod:`.score`). ``python -m skewd.lab.netlab`` is its command line;
``bench/detection_real.py`` its benchmark; ``tests/e2e/test_reallab_smoke.py`` its CI smoke.

Nothing in the product imports this package.
"""
