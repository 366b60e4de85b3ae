"""certs.pki and the `python -m slurmgate.certs` CLI."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from slurmgate.certs import pki
from slurmgate.certs.__main__ import main

SVC_NAMES = [
    "slurmgate-webhook",
    "slurmgate-webhook.slurmgate-system",
    "slurmgate-webhook.slurmgate-system.svc",
    "slurmgate-webhook.slurmgate-system.svc.cluster.local",
]


def _eku(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def ca() -> tuple[pki.PrivateKey, x509.Certificate]:
    return pki.make_ca("test-ca", days=30)


def test_ca_is_a_ca(ca: tuple[pki.PrivateKey, x509.Certificate]) -> None:
    key, cert = ca
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign
    assert pki.signed_by(cert, cert)  # self-signed
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert isinstance(key.curve, ec.SECP256R1)


def test_serving_cert_sans_usages_chain(ca: tuple[pki.PrivateKey, x509.Certificate]) -> None:
    ca_key, ca_cert = ca
    key, cert = pki.make_cert(
        ca_key, ca_cert, "svc", dns_names=SVC_NAMES, ip_addresses=["127.0.0.1", "::1"], days=10
    )
    dns, ips = pki.sans(cert)
    assert dns == SVC_NAMES
    assert ips == ["127.0.0.1", "::1"]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert _eku(cert) == {ExtendedKeyUsageOID.SERVER_AUTH}
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and not ku.key_cert_sign
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # chain: the signature verifies with the CA public key
    ca_pub = ca_cert.public_key()
    assert isinstance(ca_pub, ec.EllipticCurvePublicKey)
    assert cert.signature_hash_algorithm is not None
    sig_alg = ec.ECDSA(cert.signature_hash_algorithm)
    ca_pub.verify(cert.signature, cert.tbs_certificate_bytes, sig_alg)  # raises if invalid
    assert pki.signed_by(cert, ca_cert)
    assert pki.key_matches(key, cert)
    # a foreign CA does not verify it
    _, other = pki.make_ca("test-ca", days=30)
    assert not pki.signed_by(cert, other)
    # never outlives the CA
    assert cert.not_valid_after_utc <= ca_cert.not_valid_after_utc


def test_cert_capped_at_ca_expiry(ca: tuple[pki.PrivateKey, x509.Certificate]) -> None:
    _, cert = pki.make_cert(ca[0], ca[1], "svc", dns_names=["a"], days=3650)
    assert cert.not_valid_after_utc == ca[1].not_valid_after_utc


def test_client_cert_rsa_with_groups(ca: tuple[pki.PrivateKey, x509.Certificate]) -> None:
    key, cert = pki.make_cert(
        ca[0], ca[1], "kube-admin", organizations=["system:masters"],
        client=True, server=False, key_type="rsa",
    )
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048
    assert _eku(cert) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    assert pki.sans(cert) == ([], [])
    org = cert.subject.get_attributes_for_oid(x509.oid.NameOID.ORGANIZATION_NAME)
    assert [a.value for a in org] == ["system:masters"]
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_encipherment


def test_both_usages_and_rsa_ca() -> None:
    ca_key, ca_cert = pki.make_ca("rsa-ca", days=5, key_type="rsa")
    _, cert = pki.make_cert(ca_key, ca_cert, "etcd", dns_names=["localhost"], client=True)
    assert _eku(cert) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert pki.signed_by(cert, ca_cert)


def test_serving_cert_needs_san(ca: tuple[pki.PrivateKey, x509.Certificate]) -> None:
    with pytest.raises(ValueError, match="SAN"):
        pki.make_cert(ca[0], ca[1], "nosan")
    with pytest.raises(ValueError):
        pki.make_cert(ca[0], ca[1], "x", dns_names=["x"], client=False, server=False)
    with pytest.raises(ValueError):
        pki.make_key("dsa")  # type: ignore[arg-type]


def test_files_modes_roundtrip(tmp_path: Path, ca: tuple[pki.PrivateKey, x509.Certificate]) -> None:
    key, cert = ca
    old = os.umask(0)  # even with a permissive umask the key is 0600
    try:
        pki.write_key(tmp_path / "sub" / "ca.key", key)
        pki.write_cert(tmp_path / "sub" / "ca.crt", cert)
        pki.write_public_key(tmp_path / "sub" / "sa.pub", key)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "sub" / "ca.key") == 0o600
    assert _mode(tmp_path / "sub" / "ca.crt") == 0o644
    assert pki.load_cert(tmp_path / "sub" / "ca.crt") == cert
    assert pki.key_matches(pki.load_key(tmp_path / "sub" / "ca.key"), cert)
    assert b"PUBLIC KEY" in (tmp_path / "sub" / "sa.pub").read_bytes()
    # overwriting an existing (wrongly world-readable) key file leaves it 0600
    target = tmp_path / "sub" / "ca.key"
    target.chmod(0o644)
    pki.write_key(target, key)
    assert _mode(target) == 0o600
    assert not [p for p in (tmp_path / "sub").iterdir() if p.name.endswith(".tmp")]


def test_expires_within(tmp_path: Path) -> None:
    _, cert = pki.make_ca("short", days=10)
    pki.write_cert(tmp_path / "c.crt", cert)
    assert pki.expires_within(tmp_path / "c.crt", 11)
    assert not pki.expires_within(tmp_path / "c.crt", 9)
    with pytest.raises(FileNotFoundError):
        pki.expires_within(tmp_path / "missing.crt", 1)


# --- CLI ---------------------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    out, err = capsys.readouterr()
    for marker in ("PRIVATE KEY", "BEGIN", "MII", "MIG", "LS0t"):  # no PEM, no base64 of it
        assert marker not in out and marker not in err
    return out


def _webhook(capsys: pytest.CaptureFixture[str], out: Path, *extra: str) -> str:
    return _run(
        capsys, "webhook", "--out", str(out), "--namespace", "slurmgate-system",
        "--service", "slurmgate-webhook", "--ip", "127.0.0.1", *extra,
    )


def test_cli_webhook_issues_then_reuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    secret, bundle = tmp_path / "secret.yaml", tmp_path / "ca-bundle.b64"
    text = _webhook(
        capsys, out, "--secret-manifest", str(secret), "--ca-bundle-out", str(bundle)
    )
    assert "issued" in text and "expires" in text and str(out / "tls.key") in text
    for name in ("ca.key", "tls.key"):
        assert _mode(out / name) == 0o600
        body = [ln for ln in (out / name).read_text().splitlines() if "-----" not in ln]
        assert body and not any(ln in text for ln in body)
    assert _mode(secret) == 0o600
    ca_cert, leaf = pki.load_cert(out / "ca.crt"), pki.load_cert(out / "tls.crt")
    assert pki.signed_by(leaf, ca_cert)
    assert pki.sans(leaf) == (SVC_NAMES, ["127.0.0.1"])
    assert _eku(leaf) == {ExtendedKeyUsageOID.SERVER_AUTH}
    remaining = leaf.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(days=364) < remaining <= dt.timedelta(days=365)

    doc = yaml.safe_load(secret.read_text())
    assert doc["type"] == "kubernetes.io/tls"
    assert doc["metadata"] == {"name": "slurmgate-webhook-tls", "namespace": "slurmgate-system"}
    assert base64.b64decode(doc["data"]["tls.key"]) == (out / "tls.key").read_bytes()
    assert base64.b64decode(doc["data"]["tls.crt"]) == (out / "tls.crt").read_bytes()
    assert base64.b64decode(bundle.read_text().strip()) == (out / "ca.crt").read_bytes()

    before = {p: (out / p).read_bytes() for p in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
    text = _webhook(capsys, out)
    assert "issued" not in text and text.count("reused") == 2
    assert before == {p: (out / p).read_bytes() for p in before}


def test_cli_webhook_renews(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    _webhook(capsys, out, "--days", "20", "--renew-before-days", "5")
    ca_before, leaf_before = (out / "ca.crt").read_bytes(), (out / "tls.crt").read_bytes()

    # leaf expiring within renew-before-days: new leaf, same CA
    text = _webhook(capsys, out, "--days", "40", "--renew-before-days", "25")
    assert (out / "ca.crt").read_bytes() == ca_before
    assert (out / "tls.crt").read_bytes() != leaf_before
    assert "tls.crt" in text and "issued" in text
    assert pki.signed_by(pki.load_cert(out / "tls.crt"), pki.load_cert(out / "ca.crt"))

    # changed SANs: new leaf
    leaf_before = (out / "tls.crt").read_bytes()
    _webhook(capsys, out, "--days", "40", "--renew-before-days", "25", "--ip", "10.0.0.1")
    assert (out / "tls.crt").read_bytes() != leaf_before
    assert pki.sans(pki.load_cert(out / "tls.crt"))[1] == ["127.0.0.1", "10.0.0.1"]

    # CA expiring: new CA and a new leaf signed by it
    pki.write_cert(out / "ca.crt", pki.make_ca("old", days=3)[1])  # also mismatches ca.key
    _webhook(capsys, out)
    new_ca = pki.load_cert(out / "ca.crt")
    assert not pki.expires_within(out / "ca.crt", 30)
    assert pki.signed_by(pki.load_cert(out / "tls.crt"), new_ca)
    assert pki.key_matches(pki.load_key(out / "ca.key"), new_ca)


def test_cli_rejects_renew_ge_days(tmp_path: Path) -> None:
    argv = ["webhook", "--out", str(tmp_path), "--days", "10", "--renew-before-days", "10"]
    assert main(argv) == 2


@pytest.mark.parametrize("url", [None, "https://127.0.0.1:9443/mutate"])
def test_cli_webhook_patch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str | None
) -> None:
    out = tmp_path / "certs"
    _webhook(capsys, out, "--ca-bundle-out", str(tmp_path / "b64"))
    patch = tmp_path / "gen" / "webhook-patch.yaml"
    argv = ["webhook-patch", "--ca-bundle-file", str(tmp_path / "b64"), "--out", str(patch)]
    _run(capsys, *argv, *(["--url", url] if url else []))
    doc = yaml.safe_load(patch.read_text())
    assert doc["kind"] == "MutatingWebhookConfiguration"
    assert doc["metadata"]["name"] == "slurmgate"
    (hook,) = doc["webhooks"]
    assert hook["name"] == "pods.slurmgate.io"
    cc = hook["clientConfig"]
    assert base64.b64decode(cc["caBundle"]) == (out / "ca.crt").read_bytes()
    if url:
        assert cc["url"] == url and "service" in cc and cc["service"] is None
    else:
        assert set(cc) == {"caBundle"}
    # a PEM file is accepted as well, giving the same bundle
    _run(capsys, "webhook-patch", "--ca-bundle-file", str(out / "ca.crt"), "--out", str(patch))
    assert yaml.safe_load(patch.read_text())["webhooks"][0]["clientConfig"]["caBundle"] == cc[
        "caBundle"
    ]


def test_cli_webhook_patch_rejects_garbage(tmp_path: Path) -> None:
    (tmp_path / "bad").write_text("not base64 !!")
    out = tmp_path / "p.yaml"
    argv = ["webhook-patch", "--ca-bundle-file", str(tmp_path / "bad"), "--out", str(out)]
    assert main(argv) == 2
    assert not out.exists()
    assert main([*argv, "--url", "http://x"]) == 2
