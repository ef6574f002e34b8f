"""Connection config and authentication against real servers: user/password, token, TLS (mutual),
and the errors an operator sees when something does not match."""
from __future__ import annotations

import asyncio
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from skewd.agent.publisher import Publisher
from skewd.agent.spool import Spool
from skewd.model import Finding, Layer, Scope, Severity, State
from skewd.natsutil import (NatsAuthError, NatsConfig, NatsConfigError, NatsTLSError, NatsUnavailableError,
                            connect, connect_options, free_port, redact_url)

pytestmark = pytest.mark.timeout(60)

USER, PASSWORD, TOKEN = "skewd-agent", "s3cret-Pa55", "t0ken-abc123"


@pytest.fixture(scope="module")
def userpass_server(nats_server_factory):
    return nats_server_factory(user=USER, password=PASSWORD)


@pytest.fixture(scope="module")
def token_server(nats_server_factory):
    return nats_server_factory(token=TOKEN)


async def _roundtrip(nc) -> bytes:
    sub = await nc.subscribe("skewd.v1.health.auth.check")
    await nc.publish("skewd.v1.health.auth.check", b"ping")
    return (await asyncio.wait_for(sub.next_msg(), 5)).data


# ---- user / password ------------------------------------------------------------------------

async def test_right_user_and_password_connect(userpass_server) -> None:
    nc = await connect(NatsConfig(servers=(userpass_server.url,), user=USER, password=PASSWORD), initial_timeout=5)
    try:
        assert await _roundtrip(nc) == b"ping"
    finally:
        await nc.close()


async def test_wrong_password_is_refused_with_an_actionable_error(userpass_server) -> None:
    cfg = NatsConfig(servers=(userpass_server.url,), user=USER, password="wrong-password")
    with pytest.raises(NatsAuthError) as ei:
        await asyncio.wait_for(connect(cfg, initial_timeout=20), 10)  # refused fast, not after the timeout
    msg = str(ei.value)
    assert "refused our credentials" in msg and f"user {USER!r}" in msg
    assert "Authorization Violation" in msg and "nats.user / nats.password" in msg
    assert "wrong-password" not in msg  # never echo a secret


async def test_missing_credentials_are_refused_and_the_hint_says_what_to_set(userpass_server) -> None:
    with pytest.raises(NatsAuthError, match="no credentials.*set user/password, token"):
        await asyncio.wait_for(connect(NatsConfig(servers=(userpass_server.url,)), initial_timeout=20), 10)


async def test_publisher_with_wrong_credentials_reports_and_keeps_spooling(userpass_server, tmp_path: Path) -> None:
    f = Finding(rule_id="R-1", pathology="p", severity=Severity.INFO, layer=Layer.HOST, scope=Scope.NODE,
                node="n1", entity="", state=State.FIRING, active_at=1.0, evaluated_at=2.0, cluster="auth")
    with Spool(tmp_path / "bad") as sp:
        pub = Publisher(NatsConfig(servers=(userpass_server.url,), user=USER, password="nope",
                                   reconnect_time_wait=0.2), sp, cluster="auth")
        await pub.start()
        try:
            pub.publish_finding(f)
            with pytest.raises(NatsAuthError, match="refused our credentials"):
                await asyncio.wait_for(pub.wait_connected(10), 15)
            assert sp.depth == 1 and pub.stats.auth_errors >= 1 and not pub.stats.connected
            assert "refused our credentials" in pub.stats.last_error
        finally:
            await pub.close()
    with Spool(tmp_path / "good") as sp:  # the right password: JetStream works under this auth too
        pub = Publisher(NatsConfig(servers=(userpass_server.url,), user=USER, password=PASSWORD), sp, cluster="auth")
        await pub.start()
        try:
            pub.publish_finding(f)
            await asyncio.wait_for(pub.wait_connected(10), 15)
            assert await pub.wait_drained(10) and pub.stats.published == 1
        finally:
            await pub.close()


async def test_a_user_denied_publish_on_findings_is_told_what_to_grant(nats_server_factory, tmp_path: Path) -> None:
    conf = ('authorization { users = [ { user: "ro", password: "pw", '
            'permissions: { publish: { deny: ["skewd.v1.finding.>"] } } } ] }\n')
    srv = nats_server_factory(config_text=conf)
    f = Finding(rule_id="R-1", pathology="p", severity=Severity.INFO, layer=Layer.HOST, scope=Scope.NODE,
                node="n1", entity="", state=State.FIRING, active_at=1.0, evaluated_at=2.0, cluster="perm")
    with Spool(tmp_path / "s") as sp:
        pub = Publisher(NatsConfig(servers=(srv.url,), user="ro", password="pw"), sp, cluster="perm",
                        pub_ack_timeout=0.5, retry_backoff=(0.1, 0.2))
        await pub.start()
        try:
            await asyncio.wait_for(pub.wait_connected(5), 10)
            pub.publish_finding(f)
            for _ in range(100):
                if pub.stats.auth_errors:
                    break
                await asyncio.sleep(0.05)
            assert "permissions violation for publish" in pub.stats.last_error.lower()
            assert "skewd nats-auth" in pub.stats.last_error and "skewd.v1.finding.perm.n1" in pub.stats.last_error
            assert sp.depth == 1 and pub.stats.published == 0  # kept, in order, until an operator fixes it
        finally:
            await pub.close()


# ---- token ----------------------------------------------------------------------------------

async def test_right_token_connects(token_server) -> None:
    nc = await connect(NatsConfig(servers=(token_server.url,), token=TOKEN), initial_timeout=5)
    try:
        assert await _roundtrip(nc) == b"ping"
    finally:
        await nc.close()


async def test_wrong_token_is_refused_without_echoing_it(token_server) -> None:
    with pytest.raises(NatsAuthError) as ei:
        await asyncio.wait_for(connect(NatsConfig(servers=(token_server.url,), token="guess-1"), initial_timeout=20), 10)
    msg = str(ei.value)
    assert "refused our credentials (a token)" in msg and "nats.token" in msg and "guess-1" not in msg


# ---- nkey ------------------------------------------------------------------------------------

async def test_nkey_seed_file_authenticates_and_a_foreign_seed_is_refused(nats_server_factory, tmp_path: Path) -> None:
    nkeys = pytest.importorskip("nkeys", reason="nkey auth needs the 'nkeys' package (nats-py[nkeys]), "
                                               "not a skewd dependency yet")
    import os

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    (tmp_path / "agent.nk").write_bytes(seed)
    (tmp_path / "other.nk").write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    srv = nats_server_factory(config_text=f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}\n')
    nc = await connect(NatsConfig(servers=(srv.url,), nkey_seed_file=str(tmp_path / "agent.nk")), initial_timeout=5)
    try:
        assert await _roundtrip(nc) == b"ping"
    finally:
        await nc.close()
    with pytest.raises(NatsAuthError, match="nkey seed in .*other.nk.*nats.nkey_seed_file"):
        await asyncio.wait_for(connect(NatsConfig(servers=(srv.url,), nkey_seed_file=str(tmp_path / "other.nk")),
                                       initial_timeout=20), 10)


# ---- unreachable ----------------------------------------------------------------------------

async def test_no_server_is_temporary_not_an_auth_problem() -> None:
    cfg = NatsConfig(servers=(f"nats://127.0.0.1:{free_port()}",), reconnect_time_wait=0.2)
    with pytest.raises(NatsUnavailableError, match="connection refused.*gave up after 1s"):
        await asyncio.wait_for(connect(cfg, initial_timeout=1), 10)


# ---- TLS ------------------------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", "/CN=skewd test CA", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "san.ext"]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=skewd {name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *ext, cwd=d)
    return d


@pytest.fixture(scope="module")
def mtls_server(nats_server_factory, pki: Path):
    conf = (f'tls {{\n  cert_file: "{pki / "server.pem"}"\n  key_file: "{pki / "server.key"}"\n'
            f'  ca_file: "{pki / "ca.pem"}"\n  verify: true\n}}\n')
    return nats_server_factory(config_text=conf)


async def test_mutual_tls_with_ca_and_client_certificate_connects(mtls_server, pki: Path) -> None:
    cfg = NatsConfig(servers=(mtls_server.url,), tls_ca_file=str(pki / "ca.pem"),
                     tls_cert_file=str(pki / "client.pem"), tls_key_file=str(pki / "client.key"))
    nc = await connect(cfg, initial_timeout=5)
    try:
        assert await _roundtrip(nc) == b"ping"
    finally:
        await nc.close()


async def test_tls_without_client_certificate_or_ca_is_refused_clearly(mtls_server, pki: Path) -> None:
    with pytest.raises(NatsTLSError, match="certificate required.*tls_cert_file"):
        await asyncio.wait_for(connect(NatsConfig(servers=(mtls_server.url,), tls_ca_file=str(pki / "ca.pem")),
                                       initial_timeout=20), 10)
    with pytest.raises(NatsTLSError, match="certificate verify failed.*tls_ca_file"):
        await asyncio.wait_for(connect(NatsConfig(servers=(mtls_server.url,)), initial_timeout=20), 10)


# ---- config ---------------------------------------------------------------------------------

def test_config_from_dict_reports_every_problem_at_once() -> None:
    with pytest.raises(NatsConfigError) as ei:
        NatsConfig.from_dict({"servers": ["nats://a:4222"], "user": "u", "token": "t", "tls_cert_file": "/c",
                              "pasword": "typo"})
    msg = str(ei.value)
    assert "nats.pasword: unknown key" in msg
    with pytest.raises(NatsConfigError) as ei:
        NatsConfig.from_dict({"servers": "http://a:1", "user": "u", "token": "t", "tls_cert_file": "/c"})
    msg = str(ei.value)
    for part in ("scheme must be nats://", "one auth method", "user and password go together",
                 "tls_cert_file and tls_key_file go together"):
        assert part in msg


def test_config_from_dict_accepts_a_comma_separated_server_list() -> None:
    cfg = NatsConfig.from_dict({"servers": "nats://a:4222, nats://b:4222", "token": "x", "name": "agent-n1"})
    assert cfg.servers == ("nats://a:4222", "nats://b:4222")
    opts = connect_options(cfg)
    assert opts["servers"] == ["nats://a:4222", "nats://b:4222"] and opts["token"] == "x"
    assert opts["max_reconnect_attempts"] == -1 and opts["name"] == "agent-n1"


def test_missing_credential_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(NatsConfigError, match=r"tls_ca_file: .*does not exist"):
        connect_options(NatsConfig(tls_ca_file=str(tmp_path / "nope.pem")))
    creds = NatsConfig(creds_file=str(tmp_path / "agent.creds"))
    if importlib.util.find_spec("nkeys") is None:
        with pytest.raises(NatsConfigError, match="needs the Python package 'nkeys'"):
            connect_options(creds)
    else:
        with pytest.raises(NatsConfigError, match="creds_file: .*does not exist"):
            connect_options(creds)


async def test_publisher_surfaces_config_errors_from_wait_connected(tmp_path: Path) -> None:
    with Spool(tmp_path / "s") as sp:
        pub = Publisher(NatsConfig(tls_ca_file=str(tmp_path / "missing.pem")), sp, cluster="c")
        await pub.start()
        try:
            with pytest.raises(NatsConfigError, match="tls_ca_file"):
                await asyncio.wait_for(pub.wait_connected(5), 10)
        finally:
            await pub.close()


def test_urls_are_redacted_in_messages() -> None:
    assert redact_url("nats://agent:hunter2@10.0.0.1:4222") == "nats://agent:***@10.0.0.1:4222"
    assert redact_url("nats://tok3n@host:4222") == "nats://***@host:4222"  # a bare token in the URL
    assert redact_url("nats://host:4222") == "nats://host:4222"

