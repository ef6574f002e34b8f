"""Which end of a lossy path: flows from several nodes losing into one node are that node's
trouble (a lossy switch port or cable in front of it), and one node losing towards several is
its own egress's; a single lossy flow stays ambiguous.

The flows and nodes are those of the real lab's ingress-drops run, seed 502 (a 3-packet queue on
the switch port into n2, collectives on a dedicated port: n2's ring neighbours n1 and n3 send to
it): NS-7 fired on n1 and n3 for their flows into n2, EW-6 on n3, NS-4 on n2 for n3's flow.
NOTE: times and evidence are invented; the rules, entities and scopes are the run's."""
from __future__ import annotations

import pytest

from skewd.collectors.pkt.flowkey import hosts_of
from skewd.controller import losspath
from skewd.controller.config import ConfigError
from skewd.controller.configtypes import LossPaths
from skewd.model import Layer, Scope

from .sim import finding
from .test_honest_correlation import _cfg, _corr, _open

N1, N2, N3, N0 = "10.72.1.11", "10.72.1.12", "10.72.1.13", "10.72.1.10"


def flow(src: str, dst: str, sport: int = 40000, dport: int = 50000) -> str:
    return f"tcp {src}:{sport}>{dst}:{dport}"


def egress(node: str, entity: str, t: float = 100.0):
    return finding(node, "NS-7-egress-retransmits", "NS-7", Layer.NETWORK, t, cluster="c", entity=entity,
                   scope=Scope.FLOW, maturity="incubating")


def ingress(node: str, entity: str, t: float = 100.0):
    return finding(node, "NS-4-ingress-retransmits", "NS-4", Layer.NETWORK, t, cluster="c", entity=entity,
                   scope=Scope.FLOW, maturity="incubating")


def storm(node: str, t: float = 100.0):
    return finding(node, "EW-6-tcp-loss-storm", "EW-6", Layer.NETWORK, t, cluster="c", scope=Scope.NODE,
                   maturity="incubating")


def test_flow_names_give_their_two_addresses() -> None:
    assert hosts_of("tcp 10.0.0.1:5000>10.0.0.2:4791") == ("10.0.0.1", "10.0.0.2")
    assert hosts_of("udp [fe80::1]:4791>[fe80::2]:4791") == ("fe80::1", "fe80::2")
    assert hosts_of("gre 10.0.0.1>10.0.0.2") == ("10.0.0.1", "10.0.0.2")
    assert hosts_of("ip41 fe80::1>fe80::2") == ("fe80::1", "fe80::2")
    assert hosts_of("") is None and hosts_of("eth0") is None and hosts_of("mlx5_0/1") is None


def test_two_senders_losing_into_one_node_are_that_nodes_ingress() -> None:
    n3_out, n1_out = egress("n3", flow(N3, N2)), egress("n1", flow(N1, N2, 40001, 50001))
    n2_in = ingress("n2", flow(N3, N2))
    n3_storm = storm("n3")
    got = losspath.attribute([n3_out, n1_out, n2_in, n3_storm], LossPaths())
    assert got == {n3_out.fingerprint: n2_in, n1_out.fingerprint: n2_in, n3_storm.fingerprint: n2_in}


def test_one_sender_losing_towards_two_nodes_is_that_senders_egress() -> None:
    n1_out = egress("n1", flow(N1, N2))
    n2_in, n0_in = ingress("n2", flow(N1, N2)), ingress("n0", flow(N1, N0, 40002, 50002))
    got = losspath.attribute([n1_out, n2_in, n0_in], LossPaths())
    assert got == {n2_in.fingerprint: n1_out, n0_in.fingerprint: n1_out}


@pytest.mark.parametrize("case", ["one flow", "no holder", "sender loses elsewhere too", "off"])
def test_ambiguous_or_unheld_loss_stays_where_it_was_seen(case: str) -> None:
    paths = LossPaths()
    if case == "one flow":  # one sender, one receiver: either end may be the lossy one
        fs = [egress("n1", flow(N1, N2)), ingress("n2", flow(N1, N2))]
    elif case == "no holder":  # two senders converge on n2, but n2 itself saw nothing to hold it
        fs = [egress("n1", flow(N1, N2)), egress("n3", flow(N3, N2))]
    elif case == "sender loses elsewhere too":  # n1 also loses towards n0: not n2's alone
        fs = [egress("n1", flow(N1, N2)), egress("n1", flow(N1, N0, 40003, 50003)), egress("n3", flow(N3, N2)),
              ingress("n2", flow(N3, N2))]
    else:
        fs = [egress("n3", flow(N3, N2)), egress("n1", flow(N1, N2)), ingress("n2", flow(N3, N2))]
        paths = LossPaths(ingress=(), egress=(), node=())
    assert losspath.attribute(fs, paths) == {}


def test_the_correlator_opens_one_incident_on_the_node_behind_the_lossy_port() -> None:
    """Seed 502's findings: before, four incidents, three of them on the healthy neighbours
    (skewd replay of the run's recording with loss_paths off reproduces them)."""
    c = _corr(_cfg())
    n3_out, n1_out = egress("n3", flow(N3, N2), 100.0), egress("n1", flow(N1, N2, 40001, 50001), 103.0)
    n2_in, n3_storm = ingress("n2", flow(N3, N2), 103.5), storm("n3", 109.0)
    for f in (n3_out, n1_out, n2_in, n3_storm):
        c.observe(f)
    (inc,) = _open(c, 110.0)
    assert inc.pathology == "NS-4" and inc.group == {"node": "n2"}
    assert sorted(inc.inhibited) == sorted([n3_out.id, n1_out.id, n3_storm.id])
    # with it off (the old behaviour), each sender has incidents of its own
    off = _corr(_cfg(loss_paths={"ingress": [], "egress": [], "node": []}))
    for f in (n3_out, n1_out, n2_in, n3_storm):
        off.observe(f)
    assert sorted((i.pathology, i.group["node"]) for i in _open(off, 110.0)) == \
        [("EW-6", "n3"), ("NS-4", "n2"), ("NS-7", "n1"), ("NS-7", "n3")]


def test_loss_paths_config_is_checked_key_by_key() -> None:
    with pytest.raises(ConfigError) as e:
        _cfg(loss_paths={"ingres": ["NS-4"], "egress": ["NS-77"]})
    msg = str(e.value)
    assert "unknown key correlation.loss_paths.ingres; did you mean ingress?" in msg
    assert "correlation.loss_paths.egress: unknown pathology ID 'NS-77'" in msg
    assert _cfg(loss_paths={"node": []}).loss_paths == LossPaths(node=())
