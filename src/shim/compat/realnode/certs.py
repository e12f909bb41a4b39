"""Test certificates for the control plane, made with openssl(1): a CA, serving and client certs.

Every key is EC P-256 (fast to make, accepted by the API server and its clients). The openssl
configuration is written per certificate, so the host's openssl.cnf adds nothing. Debian's
openssl comes with ca-certificates, so no Python package is needed.

    ca = CertificateAuthority.create(folder / "pki")
    server = ca.issue("apiserver", common_name="kube-apiserver", ips=["127.0.0.1"], dns=["localhost"])
    admin = ca.issue("admin", common_name="devshim-admin", organizations=["system:masters"])
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DAYS = 3650
OPENSSL_TIMEOUT_S = 30.0


class CertificateError(RuntimeError):
    """openssl is missing or refused; the message says which, and what openssl said."""


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        raise CertificateError("the control plane makes its certificates with openssl, which is not on PATH")
    done = subprocess.run(
        ["openssl", *args], capture_output=True, text=True, timeout=OPENSSL_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {(done.stderr or done.stdout).strip()[-500:]}")


def new_key(path: Path) -> Path:
    """A new EC P-256 private key (PKCS#8 PEM), readable by its owner only."""
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    path.chmod(0o600)
    return path


def public_key(key: Path, path: Path) -> Path:
    """The public half of `key`, as a PEM "PUBLIC KEY" (what --service-account-key-file reads)."""
    _openssl("pkey", "-in", str(key), "-pubout", "-out", str(path))
    return path


def _config(path: Path, subject: Sequence[tuple[str, str]], extensions: Sequence[str]) -> Path:
    lines = ["[req]", "prompt = no", "distinguished_name = dn", "[dn]"]
    lines += [f"{n}.{key} = {value}" for n, (key, value) in enumerate(subject)]
    lines += ["[ext]", *extensions, ""]
    path.write_text("\n".join(lines))
    return path


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA in `folder` (ca.crt, ca.key) that issues certificates beside it."""

    folder: Path

    @property
    def cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def key(self) -> Path:
        return self.folder / "ca.key"

    @classmethod
    def create(cls, folder: Path, common_name: str = "devshim-test-ca") -> CertificateAuthority:
        """The CA in `folder`, made now unless the folder holds one (a restart keeps its CA)."""
        ca = cls(folder)
        if ca.cert.is_file() and ca.key.is_file():
            return ca
        folder.mkdir(parents=True, exist_ok=True)
        config = _config(folder / "ca.cnf", [("CN", common_name)], [
            "basicConstraints = critical, CA:TRUE",
            "keyUsage = critical, keyCertSign, cRLSign, digitalSignature",
            "subjectKeyIdentifier = hash",
        ])  # fmt: skip
        new_key(ca.key)
        _openssl("req", "-new", "-x509", "-config", str(config), "-extensions", "ext", "-key", str(ca.key),
                 "-days", str(DAYS), "-out", str(ca.cert))  # fmt: skip
        return ca

    def issue(
        self, name: str, *, common_name: str, organizations: Sequence[str] = (),
        ips: Sequence[str] = (), dns: Sequence[str] = (),
    ) -> KeyPair:  # fmt: skip
        """`name`.crt and `name`.key beside the CA: a serving certificate when `ips` or `dns`
        are given (for those names), else a client certificate for user `common_name` in the
        groups `organizations` (how the API server reads a client certificate)."""
        pair = KeyPair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        subject = [*(("O", org) for org in organizations), ("CN", common_name)]
        names = [f"IP:{ip}" for ip in ips] + [f"DNS:{host}" for host in dns]
        usage = "serverAuth" if names else "clientAuth"
        extensions = [
            "basicConstraints = critical, CA:FALSE",
            "keyUsage = critical, digitalSignature, keyEncipherment",
            f"extendedKeyUsage = {usage}",
            "authorityKeyIdentifier = keyid",
        ]
        if names:
            extensions.append(f"subjectAltName = {', '.join(names)}")
        config = _config(self.folder / f"{name}.cnf", subject, extensions)
        new_key(pair.key)
        request = self.folder / f"{name}.csr"
        _openssl("req", "-new", "-config", str(config), "-key", str(pair.key), "-out", str(request))
        _openssl("x509", "-req", "-in", str(request), "-CA", str(self.cert), "-CAkey", str(self.key),
                 "-CAcreateserial", "-days", str(DAYS), "-extfile", str(config), "-extensions", "ext",
                 "-out", str(pair.cert))  # fmt: skip
        return pair
