"""A Flower deployment on this machine: a SuperLink and SuperNodes as separate processes, driven by ``flwr run``.

:class:`LocalDeployment` is what the deployment tests and ``bench/bench_flower.py`` use, and what a user can read as
the commands of a deployment (its ``commands`` list holds every command it ran). Everything listens on
127.0.0.1 only, on free ports, without TLS (``--insecure``) unless SuperNode authentication asks for it
(:func:`make_tls` writes a certificate authority and the SuperLink's certificate for 127.0.0.1). Flower's user
configuration (``FLWR_HOME``) is a folder of the deployment's own, whose ``config.toml`` names the local SuperLink
as the connection ``local-fl``. Every wait has a timeout, and :meth:`LocalDeployment.close` ends every process it
started (their whole process groups: a SuperNode starts a SuperExec and a ``flwr-clientapp`` process per message).

The app that ``flwr run`` sends is a folder with a ``pyproject.toml`` only (:func:`write_app`): its components are
``fl_lightning.flower.server_app:app`` and ``fl_lightning.flower.client_app:app``, installed where the SuperLink and
SuperNodes run, and its run config names the fl_lightning config.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The name of the SuperLink connection in the deployment's Flower configuration.
CONNECTION = "local-fl"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toml_value(value: Any) -> str:
    """``value`` (a string, bool or number) written as a TOML value.

    >>> print(toml_value("--model.lr 0.1"), toml_value(True), toml_value(3))
    "--model.lr 0.1" true 3
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def write_app(folder: Path, run_config: Mapping[str, Any]) -> Path:
    """Write the Flower app project ``flwr run`` sends (a ``pyproject.toml``) into ``folder``, with ``run_config``."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        "[project]",
        'name = "fl-lightning-app"',
        'version = "1.0.0"',
        'description = "fl_lightning methods as a Flower app"',
        'license = "Apache-2.0"',
        "dependencies = []",
        "",
        "[tool.flwr.app]",
        'publisher = "fl-lightning"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "fl_lightning.flower.server_app:app"',
        'clientapp = "fl_lightning.flower.client_app:app"',
        "",
        "[tool.flwr.app.config]",
        *(f"{key} = {toml_value(value)}" for key, value in run_config.items()),
    ]
    (folder / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return folder


class LocalDeployment:
    """A SuperLink and SuperNodes on 127.0.0.1, each a process group of its own, with logs under ``root``.

    Args:
        root: a folder for the deployment's Flower configuration, app, keys and logs.
        env: extra environment for every process (e.g. ``OMP_NUM_THREADS``).
    """

    def __init__(self, root: Path, env: Mapping[str, str] | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = self.root / "flwr-home"
        self.home.mkdir(exist_ok=True)
        self.bin = Path(sys.executable).parent
        self.env = dict(os.environ)
        self.env.update(
            {
                "FLWR_HOME": str(self.home),
                "FLWR_DISABLE_UPDATE_CHECK": "1",
                "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.env.update(env or {})
        self.port: int | None = None
        self.tls: dict[str, Path] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: list[list[str]] = []

    # ---- processes ---------------------------------------------------------------------------------------------------

    def _start(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        self.commands.append(command)
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115  # the child keeps writing after this returns
        try:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.root, start_new_session=True
            )
        finally:
            log.close()
        self.processes[name] = proc
        return proc

    def log(self, name: str) -> str:
        """What process ``name`` has written so far."""
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_superlink(self, node_auth: bool = False, timeout: float = 60.0) -> int:
        """Start the SuperLink; its port, once it accepts connections.

        ``node_auth``: with TLS (:func:`make_tls`), admitting only the SuperNodes whose public keys are registered
        (:meth:`register`).
        """
        self.port = free_port()
        if node_auth:
            self.tls = make_tls(self.root / "tls")
            security = [
                *("--ssl-ca-certfile", str(self.tls["ca"])),
                *("--ssl-certfile", str(self.tls["cert"])),
                *("--ssl-keyfile", str(self.tls["key"])),
                "--enable-supernode-auth",
            ]
        else:
            security = ["--insecure"]
        command = [
            str(self.bin / "flower-superlink"),
            *security,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--disable-runtime-dependency-installation",
        ]
        proc = self._start("superlink", command)
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the SuperLink exited with {proc.returncode}: {self.log('superlink')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    break
            except OSError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the SuperLink did not accept connections within {timeout:g}s") from None
                time.sleep(0.2)
        security_toml = f"root-certificates = {toml_value(self.tls['ca'])}" if self.tls else "insecure = true"
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\n{security_toml}\n'
        )
        return self.port

    def start_supernode(
        self,
        partition: int,
        num_partitions: int,
        name: str | None = None,
        key: Path | None = None,
        node_options: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a SuperNode holding ``partition`` (``key``: its private key file, for SuperNode authentication)."""
        assert self.port is not None, "start the SuperLink first"
        config = f"partition-id={partition} num-partitions={num_partitions}"
        if node_options:
            config += f" options={toml_value(node_options)}"
        security = ["--root-certificates", str(self.tls["ca"])] if self.tls else ["--insecure"]
        command = [
            str(self.bin / "flower-supernode"),
            *security,
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--node-config",
            config,
        ]
        if key is not None:
            command += ["--auth-supernode-private-key", str(key)]
        return self._start(name or f"supernode-{partition}", command)

    def stop(self, name: str, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send process ``name``'s group ``sig`` and wait for the process (at most ``timeout`` seconds)."""
        proc = self.processes.get(name)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout)

    def close(self) -> None:
        """End every process the deployment started: SIGTERM to each group, then SIGKILL to what is left."""
        for proc in reversed(list(self.processes.values())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            else:
                self._kill_group(proc.pid)
        deadline = time.monotonic() + 10.0
        for proc in self.processes.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self._kill_group(proc.pid)
            if proc.poll() is None:
                proc.wait(10.0)

    @staticmethod
    def _kill_group(pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> LocalDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the Flower command line -------------------------------------------------------------------------------------

    def flwr(self, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run ``flwr <args>`` against the deployment (its own ``FLWR_HOME``), at most ``timeout`` seconds."""
        command = [str(self.bin / "flwr"), *args]
        self.commands.append(command)
        return subprocess.run(
            command, env=self.env, cwd=self.root, capture_output=True, text=True, timeout=timeout, check=False
        )

    def run(self, run_config: Mapping[str, Any], timeout: float, app: str = "app") -> subprocess.CompletedProcess[str]:
        """``flwr run`` the fl_lightning app with ``run_config`` and follow it to its end (``--stream``)."""
        folder = write_app(self.root / app, run_config)
        return self.flwr(["run", str(folder), CONNECTION, "--stream"], timeout)

    def register(self, public_key: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``flwr supernode register`` the SuperNode whose public key is the file ``public_key``."""
        return self.flwr(["supernode", "register", str(public_key), CONNECTION], timeout)


def make_node_key(path: Path) -> Path:
    """Write a SuperNode key pair (NIST P-384, OpenSSH format): the private key at ``path``, the public at ``.pub``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    path.chmod(0o600)
    Path(f"{path}.pub").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return path


def make_tls(folder: Path, host: str = "127.0.0.1") -> dict[str, Path]:
    """Write a certificate authority and a SuperLink certificate for ``host`` (a test's TLS; one day valid).

    Returns the files by role: ``ca`` (the authority's certificate, what SuperNodes and ``flwr`` trust), ``cert``
    and ``key`` (the SuperLink's certificate and private key).
    """
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, server_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fl_lightning test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    files["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    files["key"].chmod(0o600)
    return files
