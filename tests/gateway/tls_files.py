"""Throw-away certificates for the TLS tests, made with the `openssl` command line.

The `cryptography` package is not a dependency of this project, so the tests use the openssl
binary the system already has (EC P-256 keys: quick to generate).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class CertPair:
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> CertPair:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    return CertPair(cert, key)


def make_signed(
    directory: Path, name: str, ca: CertPair, usage: str, alt_names: str = "DNS:localhost,IP:127.0.0.1"
) -> CertPair:
    """A certificate for `alt_names` (localhost/127.0.0.1) signed by `ca`; usage is serverAuth or clientAuth."""
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    extensions = directory / f"{name}.ext"
    extensions.write_text(f"subjectAltName={alt_names}\nextendedKeyUsage={usage}\n")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
        "-out", str(cert), "-days", "1", "-extfile", str(extensions),
        cwd=directory,
    )  # fmt: skip
    return CertPair(cert, key)
