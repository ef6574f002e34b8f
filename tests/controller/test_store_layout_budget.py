"""The window store's layout cache bound (``WindowStore.layout_budget``) decides only how often
a batch takes the general path, never what is stored: a controller's store fed by thousands of
nodes raises it so every node's layout stays cached between that node's summaries."""
from __future__ import annotations

import random

import numpy as np
import pytest

from skewd.catalogue import full_catalogue
from skewd.model import SampleBatch
from skewd.rules.store import WindowStore

SIGNALS = ["summary_gpu_util_mean_ratio", "summary_gpu_power_watts", "summary_requests_waiting",
           "summary_kv_cache_usage_ratio", "summary_engine_phase", "gpu_utilization_ratio", "not_catalogued_x"]


class Counting(WindowStore):
    general = 0

    def _ingest_general(self, batch):
        self.general += 1
        super()._ingest_general(batch)


class GeneralOnly(WindowStore):
    def _known_layout(self, batch, shared=False):
        return None


def _col(values):
    a = np.empty(len(values), dtype=object)
    a[:] = values
    return a


def _rounds(nodes: int, rounds: int, seed: int):
    """One-node, one-time batches (a summary each), node after node, round after round; a few
    nodes gain an entity now and then, a few values are NaN, a few batches are late."""
    rng = random.Random(seed)
    cols = {}
    for i in range(nodes):
        pairs = [(s, "") for s in SIGNALS[:5]] + [("gpu_utilization_ratio", f"gpu{g}") for g in range(1 + i % 3)]
        pairs.append(("not_catalogued_x", ""))
        cols[i] = pairs
    shared = {}
    out = []
    for r in range(rounds):
        for i in range(nodes):
            if rng.random() < 0.01:
                cols[i] = cols[i] + [("gpu_utilization_ratio", f"gpu{len(cols[i])}")]
            pairs = cols[i]
            key = (i, len(pairs))
            if key not in shared:  # one set of column arrays per layout, reused (shared_columns)
                shared[key] = (_col([f"n{i}"] * len(pairs)), _col([e for _, e in pairs]), _col([s for s, _ in pairs]))
            node, ent, sig = shared[key]
            t = 100.0 + r - (0.5 if rng.random() < 0.01 else 0.0)
            v = np.array([rng.random() if rng.random() > 0.02 else np.nan for _ in pairs])
            out.append(SampleBatch(np.full(len(pairs), t), node, ent, sig, v))
    return out


def _state(st: WindowStore):
    blocks = {(s, n): (b.times[: b.n].tolist(), np.nan_to_num(b.values[: b.nrows, : b.n], nan=-1.0).tolist(),
                       dict(b.rows), b.eids[: b.nrows].tolist(), b.last_seen[: b.nrows].tolist())
              for s, per in st.blocks.items() for n, b in per.items()}
    return (blocks, list(st.registry.keys), st.dropped_out_of_order, dict(st.dropped_uncatalogued),
            st.samples_ingested, st.latest_t)


@pytest.mark.parametrize("shared", [False, True])
def test_a_raised_budget_keeps_every_nodes_layout_and_stores_the_same(shared: bool) -> None:
    nodes, rounds = 600, 4
    batches = _rounds(nodes, rounds, seed=3)
    cat = full_catalogue()
    small, big, ref = Counting(cat, layout_budget=2000), Counting(cat, layout_budget=1 << 20), GeneralOnly(cat)
    per_round = len(batches) // rounds
    for r in range(rounds):
        chunk = batches[r * per_round: (r + 1) * per_round]
        for st in (small, big):
            st.ingest_many(chunk, shared_columns=shared)
        for b in chunk:
            ref.ingest(b)
        assert _state(small) == _state(ref)
        assert _state(big) == _state(ref)
    # 600 nodes' layouts (~15 samples and groups each) exceed a budget of 2,000: that store keeps
    # re-learning them,
    # the raised one resolves each layout once (new layouts and late batches aside)
    assert small.general > 3 * nodes
    assert big.general < nodes + 0.1 * nodes * rounds
    if shared:  # and recognises every node's column arrays by identity
        assert len(big._shared) >= nodes
