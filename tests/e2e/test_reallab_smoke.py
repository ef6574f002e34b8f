"""CI smoke of the real-traffic lab (``skewd.lab.netlab``): the real product, default configs,
real traffic - and the two things a user needs first:

1. a healthy stretch stays silent: no firing finding, no incident;
2. a straggler is named: one rank 20 ms late every step (an extra sleep in its compute), and
   EW-1 fires on that rank's node, while no incident or remap names a healthy node.

One lab run of about 2.5 minutes: 4 nodes, gloo all-reduce of 2 MB every ~40 ms on the port the
front end's token streams and the agents' NATS connections share (eth0), the straggler from 55 s
after the agents are up. The ranks run torch from the vLLM CPU venv the vLLM tests build
(``tests/vllm_venv.py``); with ``SKEWD_SKIP_VLLM=1`` they run the lab's plain ring all-reduce.

Namespaces: ``$SKEWD_LAB_NETNS_PREFIX`` (default ``skwr-``), addresses from ``$SKEWD_LAB_SUBNET``
(default 10.79.0.0/16); all removed at the end, whatever happens.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from skewd.lab.netlab.run import LabOptions, run
from skewd.lab.netlab.scenario import make_plan
from skewd.lab.netlab.score import firing_table
from skewd.lab.netlab.torchenv import resolve

from .. import vllm_venv

pytestmark = [
    pytest.mark.root,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="the real-traffic lab creates network namespaces, qdiscs and cgroups: "
                                                 "needs root"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="needs iproute2 (ip, tc) to run processes in namespaces and shape ports"),
]

HEALTHY_S = 55.0
DURATION_S = 135.0


@pytest.fixture(scope="module")
def rank_runtime():
    """torch (gloo) from the shared vLLM CPU venv, else the plain ring all-reduce."""
    if not vllm_venv.skip_requested():
        python, r = vllm_venv.build()
        if r.returncode != 0:
            pytest.fail(f"could not build the vLLM venv with scripts/vllm-cpu-venv.sh:\n{r.stderr[-3000:]}")
        return resolve("torch", str(python))
    try:
        return resolve("ring")
    except RuntimeError as e:
        pytest.skip(f"neither torch (SKEWD_SKIP_VLLM=1) nor the ring fallback can run: {e}")


def test_healthy_stays_silent_and_a_straggler_is_named(tmp_path, rank_runtime) -> None:
    plan = make_plan("straggler", seed=1, duration_s=DURATION_S, nodes=4, overrides={
        "period_s": 0.040, "message_bytes": 2_000_000, "dedicated_port": False, "lag_s": 0.020,
        "onset_s": HEALTHY_S, "faulty_node": 2})
    opts = LabOptions(backend=rank_runtime.backend, torch_python=rank_runtime.python)
    out = run(plan, tmp_path / "run", opts, log=print)
    res = json.loads((out / "score.json").read_text())
    truth = json.loads((out / "truth.json").read_text())
    seen = firing_table(res)
    # the fault really happened: the straggler entered every all-reduce >= 10 ms behind its peers
    assert res["straggler_lag_s"] is not None and res["straggler_lag_s"] >= 0.010, truth["steps"]

    healthy_findings = [f for f in res["firing"] if f["fired_at"] < truth["onset"]]
    healthy_incidents = [i for i in res["incident_list"] if i["published"] < truth["onset"] - truth["t0"]]
    assert not healthy_findings and not healthy_incidents, (
        f"the healthy stretch ({HEALTHY_S:.0f}s) was not silent: findings that fired (rule, node, count, "
        f"first after agents up):\n{seen}\nincidents: {[(i['pathology'], i['nodes']) for i in healthy_incidents]}")

    assert res["detected"]["EW-1"]["found"], (
        f"EW-1 did not fire on the straggler's node {truth['node']} within {DURATION_S - HEALTHY_S:.0f}s; "
        f"what fired:\n{seen}")
    wrong = [(i["pathology"], i["nodes"]) for i in res["incident_list"] if set(i["nodes"]) & set(truth["healthy_nodes"])]
    wrong += [(r["pathology"], r["nodes"], r["actions"]) for r in res["remap_list"]
              if set(r["nodes"]) & set(truth["healthy_nodes"])]
    assert not wrong, f"incidents / remaps naming a healthy node (straggler on {truth['node']}): {wrong}"
