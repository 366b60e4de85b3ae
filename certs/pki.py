"""A small X.509 toolkit on top of `cryptography`.

General enough for the webhook's serving certificate and for the local cluster's own PKI
(kube-apiserver serving/client certs, etcd, service-account signing keys).

Keys are ECDSA P-256 by default, RSA 2048 on request. Private keys are written with mode 0600
via a freshly created (O_EXCL) temporary file that is atomically renamed into place, so a key
is never readable by others, not even for a moment. Nothing here prints key material.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey
KeyType = Literal["ec", "rsa"]
_IP = ipaddress.IPv4Address | ipaddress.IPv6Address

# Back-date notBefore a little so that small clock skew between hosts does not reject a
# certificate that was just issued.
_BACKDATE = dt.timedelta(minutes=5)
DEFAULT_CA_DAYS = 3650
DEFAULT_CERT_DAYS = 365


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_key(key_type: KeyType = "ec") -> PrivateKey:
    """A new private key: ECDSA P-256 ("ec") or RSA 2048 ("rsa")."""
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"unknown key type {key_type!r} (want 'ec' or 'rsa')")


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def make_ca(
    common_name: str,
    days: int = DEFAULT_CA_DAYS,
    key_type: KeyType = "ec",
    organizations: Iterable[str] = (),
) -> tuple[PrivateKey, x509.Certificate]:
    """A self-signed CA that may sign leaf certificates only (pathLen 0)."""
    if days <= 0:
        raise ValueError("days must be positive")
    key = make_key(key_type)
    name = _name(common_name, organizations)
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(cert_sign=True, key_encipherment=False),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_cert(
    ca_key: PrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    organizations: Iterable[str] = (),
    client: bool = False,
    server: bool = True,
    days: int = DEFAULT_CERT_DAYS,
    key_type: KeyType = "ec",
    key: PrivateKey | None = None,
) -> tuple[PrivateKey, x509.Certificate]:
    """A leaf certificate signed by the CA.

    server=True adds ExtendedKeyUsage serverAuth and requires at least one SAN (DNS or IP);
    Go TLS clients such as kube-apiserver ignore the CN. client=True adds clientAuth; for
    Kubernetes client certs the CN is the user name and `organizations` are the groups.
    The certificate never outlives its CA. Pass `key` to re-certify an existing key.
    """
    if not (client or server):
        raise ValueError("a certificate must be for server and/or client use")
    if days <= 0:
        raise ValueError("days must be positive")
    dns, ips = _leaf_sans(dns_names, ip_addresses, server)
    if key is None:
        key = make_key(key_type)
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
    )
    for extension, critical in _leaf_extensions(key, ca_key, server, client, dns, ips):
        builder = builder.add_extension(extension, critical=critical)
    return key, builder.sign(ca_key, hashes.SHA256())


def _leaf_sans(
    dns_names: Iterable[str], ip_addresses: Iterable[str], server: bool
) -> tuple[list[str], list[_IP]]:
    """The SANs, each once; raises ValueError for a bad IP or a serving cert without a SAN."""
    dns = list(dict.fromkeys(dns_names))
    ips = [ipaddress.ip_address(ip) for ip in dict.fromkeys(ip_addresses)]
    if server and not (dns or ips):
        raise ValueError("a serving certificate needs at least one DNS name or IP address SAN")
    return dns, ips


def _key_usage(cert_sign: bool, key_encipherment: bool) -> x509.KeyUsage:
    """Signatures always; certificate and CRL signing for the CA only."""
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=key_encipherment,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False)


def _leaf_key_usage(key: PrivateKey) -> x509.KeyUsage:
    # RSA key exchange needs keyEncipherment; it is meaningless for ECDSA keys.
    return _key_usage(cert_sign=False, key_encipherment=isinstance(key, rsa.RSAPrivateKey))


def _leaf_extensions(
    key: PrivateKey,
    ca_key: PrivateKey,
    server: bool,
    client: bool,
    dns: list[str],
    ips: list[_IP],
) -> list[tuple[x509.ExtensionType, bool]]:
    """(extension, critical) pairs of a leaf certificate, in the order they are written."""
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    extensions: list[tuple[x509.ExtensionType, bool]] = [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (_leaf_key_usage(key), True),
        (x509.ExtendedKeyUsage(usages), False),
        (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    ]
    if dns or ips:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ip) for ip in ips]
        extensions.append((x509.SubjectAlternativeName(sans), False))
    return extensions


# --- files -------------------------------------------------------------------------------


def _atomic_write(path: str | os.PathLike[str], data: bytes, mode: int) -> None:
    """Write via a new O_EXCL temp file with `mode` from the start, then rename into place."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        os.fchmod(fd, mode)  # the umask may only have narrowed it; make it exact
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def key_pem(key: PrivateKey) -> bytes:
    """PKCS#8 PEM, unencrypted (what kube-apiserver, etcd and aiohttp's ssl module read)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_key(path: str | os.PathLike[str], key: PrivateKey) -> None:
    """Write a private key, mode 0600."""
    _atomic_write(path, key_pem(key), 0o600)


def write_public_key(path: str | os.PathLike[str], key: PrivateKey | PublicKey) -> None:
    """Write the public half (e.g. kube-apiserver --service-account-key-file), mode 0644."""
    pub: PublicKey = (key.public_key()
                      if isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) else key)
    data = pub.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _atomic_write(path, data, 0o644)


def write_cert(path: str | os.PathLike[str], cert: x509.Certificate) -> None:
    """Write a certificate as PEM, mode 0644."""
    _atomic_write(path, cert_pem(cert), 0o644)


def load_cert(path: str | os.PathLike[str]) -> x509.Certificate:
    """The first certificate in a PEM file."""
    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def load_key(path: str | os.PathLike[str]) -> PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"{path}: unsupported key type {type(key).__name__}")
    return key


def expires_within(path: str | os.PathLike[str], days: float) -> bool:
    """True if the certificate at `path` is expired or expires within `days` days.

    A certificate that is not valid yet also counts as "needs renewal". A missing file
    raises FileNotFoundError.
    """
    cert = load_cert(path)
    now = _now()
    if cert.not_valid_before_utc > now + _BACKDATE:
        return True
    return cert.not_valid_after_utc - now <= dt.timedelta(days=days)


# --- checks ------------------------------------------------------------------------------


def key_matches(key: PrivateKey, cert: x509.Certificate) -> bool:
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key.public_key().public_bytes(*fmt) == cert.public_key().public_bytes(*fmt)


def signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    """True if `cert`'s signature verifies with the CA's public key (and issuer matches)."""
    if cert.issuer != ca_cert.subject:
        return False
    pub = ca_cert.public_key()
    hash_alg = cert.signature_hash_algorithm
    if hash_alg is None:
        return False
    try:
        if isinstance(pub, ec.EllipticCurvePublicKey):
            pub.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hash_alg))
        elif isinstance(pub, rsa.RSAPublicKey):
            pub.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), hash_alg)
        else:
            return False
    except Exception:
        return False
    return True


def sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses as strings) of the certificate's SubjectAlternativeName."""
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return (
        list(ext.get_values_for_type(x509.DNSName)),
        [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)],
    )
