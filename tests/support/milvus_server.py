"""A local Milvus standalone server on 127.0.0.1, from PyPI's ``milvus`` package.

PyPI's ``milvus`` 2.3.5 ships a real Milvus standalone binary (the
``milvus run standalone`` of Milvus 2.3.5, with embedded etcd and RocksMQ)
compressed inside the wheel. It needs its own virtualenv (its launcher
breaks with ``marshmallow>=4``, ``environs>=10`` and ``pymilvus>=2.4``, so
``make setup-milvus-server`` installs ``milvus==2.3.5 'marshmallow<4'
'environs<10' 'pymilvus<2.4'`` into ``.venv-milvus`` and unpacks the binary
there once). This test-support module is what the tests and the benchmark
(bench/milvus.py) use to run it; hcqr-dspy itself talks to any Milvus
through a URI (``hcqr index --backend milvus --milvus-uri
http://host:19530``).

How a server is started here:

1. The package's own config writer (``milvus.MilvusServerConfig``, run in
   the server's virtualenv) renders ``milvus.yaml`` into a fresh data
   folder, with every component port chosen free on 127.0.0.1 beforehand
   and the component addresses set to 127.0.0.1. Its check that each port
   is free binds it with ``SO_REUSEADDR`` here, as the server's own (Go)
   listeners do: a restart takes its old proxy port at once, while the
   connections the stopped server closed still hold it in TIME_WAIT (60 s
   on Linux), where a bind without it is refused.
2. The embedded etcd gets its own config file so that its client and peer
   ports are free ones on 127.0.0.1 too (the package leaves the peer port
   at etcd's default 2380, so two servers on one machine would collide).
3. The binary is started in its own process group (``MILVUSCONF`` names
   the config folder); the server is ready when ``/healthz`` on its metrics
   port answers ``OK`` and a client can list collections.
4. :meth:`LocalMilvusServer.stop` sends SIGTERM to the process group (Milvus
   stops its components within ``common.gracefulStopTimeout``, set to 3 s
   here, and says "All cleanup done"; the 2.3.5 binary then panics while
   closing its embedded etcd client, which is harmless), waits, SIGKILLs
   whatever is left of the group, and removes the data folder if this
   object created it.

Milvus 2.3.5's gRPC components listen on every interface (it has no
listen-address setting); only etcd is bound to 127.0.0.1 alone. Clients here
always connect to 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from hcqr_dspy.errors import HCQRError
from support import process_group

DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-milvus"  # tests/support/ -> the repository root
SERVER_BIN_FOLDER = "server"  # inside the venv: the unpacked binary, bin/milvus and its libraries
DEFAULT_ROOT_TOKEN = "root:Milvus"  # Milvus's documented default credentials when authorization is on
PORT_KEYS = (
    "etcd_port",
    "proxy_port",
    "proxy_internal_port",
    "root_coord_port",
    "query_coord_port",
    "query_node_port",
    "index_coord_port",
    "index_node_port",
    "data_coord_port",
    "data_node_port",
)
# Milvus's default (common.gracefulStopTimeout, 1800 s) lets a standalone query node with loaded collections wait
# for a peer to hand its segments to, which never comes: SIGTERM then hangs. A test server has nothing to hand over.
GRACEFUL_STOP_SECONDS = 3
# Tries at free ports for the components when one is taken between being found free and bound.
PORT_ATTEMPTS = 3
COMPONENTS = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexNode", "dataCoord", "dataNode")

# Run by the server's virtualenv python: render the config with the package's own writer, unpack the binary.
_PREPARE = r"""
import json, os, socket, sys
import milvus

def try_bind_port(self, port):  # as the package's own check, with SO_REUSEADDR, as the server's listeners bind
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        return sock
    except OSError:
        sock.close()
        return None

milvus.MilvusServerConfig.try_bind_port = try_bind_port
a = json.loads(sys.argv[1])
cfg = milvus.MilvusServerConfig(data_dir=a["data_dir"], **a["ports"])
cfg.set("authorization_enabled", a["auth"])
for comp in a["components"]:
    cfg.set(comp + ".ip", "127.0.0.1")
cfg.set("common.gracefulStopTimeout", a["graceful_stop_seconds"])
if a["session_ttl"]:
    cfg.set("common.session.ttl", a["session_ttl"])
cfg.resolve()
milvus._initialize_data_files(a["bin_base"])
print(json.dumps({"version": milvus.__version__, "configs": os.path.join(cfg.base_data_dir, "configs"),
                  "logs": os.path.join(cfg.base_data_dir, "logs"),
                  "exe": os.path.join(a["bin_base"], "bin", "milvus")}))
"""


class MilvusServerError(HCQRError):
    """The local Milvus server could not be set up, started or stopped (the message says why)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_python(venv: str | Path | None = None) -> Path:
    """The server virtualenv's python (``$HCQR_MILVUS_SERVER_VENV`` or ``./.venv-milvus``).

    Raises:
        MilvusServerError: no such virtualenv, or ``milvus`` is not installed in it.
    """
    venv = Path(venv or os.environ.get("HCQR_MILVUS_SERVER_VENV") or DEFAULT_VENV)
    py = venv / "bin" / "python"
    if not py.is_file():
        raise MilvusServerError(f"no Milvus server virtualenv at {venv} (create it with `make setup-milvus-server`)")
    if not (venv / SERVER_BIN_FOLDER / "bin" / "milvus").is_file():
        probe = subprocess.run([str(py), "-c", "import milvus"], capture_output=True, text=True)
        if probe.returncode != 0:
            raise MilvusServerError(f"the virtualenv {venv} has no `milvus` package (run `make setup-milvus-server`)")
    return py


class LocalMilvusServer(process_group.ServerProcess):
    """One Milvus 2.3.5 standalone server process on 127.0.0.1.

    Args:
        venv: The server's virtualenv (default ``$HCQR_MILVUS_SERVER_VENV`` or
            ``.venv-milvus`` at the repository root).
        data_dir: Where its config, logs and data go; a fresh temporary
            folder (removed by :meth:`stop`) when omitted.
        auth: Turn on Milvus authorization; clients then need the token
            :attr:`token` (``root:Milvus``, Milvus's default root user).
        startup_timeout: Seconds to wait for the server to answer.
        session_ttl: Seconds its components' etcd sessions live without a
            keep-alive (``common.session.ttl``; Milvus's default, 30, when
            ``None``). Started again after :meth:`stop`, Milvus 2.3.5 serves
            only once the sessions of the stopped process have expired: about
            55 s after the restart with the default, 4 to 15 s with 3 (15
            when its first try to register comes before they expired). A
            process frozen (SIGSTOP) for longer than this loses its sessions.

    Example:
        >>> with LocalMilvusServer() as server:
        ...     MilvusClient(uri=server.uri).list_collections()
    """

    def __init__(
        self,
        venv: str | Path | None = None,
        data_dir: str | Path | None = None,
        auth: bool = False,
        startup_timeout: float = 180.0,
        session_ttl: int | None = None,
    ):
        self.venv = Path(venv or os.environ.get("HCQR_MILVUS_SERVER_VENV") or DEFAULT_VENV)
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else None
        self.auth = auth
        self.startup_timeout = startup_timeout
        self.session_ttl = session_ttl
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.version: str | None = None
        self.startup_seconds: float | None = None
        self._logs: list = []
        self._proxy_port: int | None = None

    @property
    def uri(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server's proxy."""
        if self.port is None:
            raise MilvusServerError("the Milvus server is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str | None:
        """The root token when authorization is on, else ``None``."""
        return DEFAULT_ROOT_TOKEN if self.auth else None

    @property
    def log_folder(self) -> Path | None:
        return self.data_dir / "logs" if self.data_dir else None

    def start(self) -> str:
        """Start the server and wait until it answers; return its URI.

        The first start takes free ports; starting again after :meth:`stop`
        (a restart, on the same ``data_dir`` when one was given) serves the
        same URI.

        Raises:
            MilvusServerError: the virtualenv is missing, the config could not
                be written, the process exited, or it did not answer within
                ``startup_timeout`` (the last lines of its log are quoted).
        """
        if self.process is not None:
            return self.uri
        py = server_python(self.venv)
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="hcqr-milvus-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for _attempt in range(PORT_ATTEMPTS):
            ports = {key: _free_port() for key in PORT_KEYS}
            peer_port, self.metrics_port = _free_port(), _free_port()
            if self._proxy_port is not None:  # a restart serves the same address, as a user's server does
                ports["proxy_port"] = self._proxy_port
            args = {
                "data_dir": str(self.data_dir),
                "ports": ports,
                "auth": self.auth,
                "components": COMPONENTS,
                "bin_base": str(self.venv / SERVER_BIN_FOLDER),
                "graceful_stop_seconds": GRACEFUL_STOP_SECONDS,
                "session_ttl": self.session_ttl,
            }
            prep = subprocess.run([str(py), "-c", _PREPARE, json.dumps(args)], capture_output=True, text=True)
            # a free port found here can be taken by another process (a server another test worker starts)
            # before the config is written: take other free ports then
            if prep.returncode == 0 or "bind failed" not in prep.stderr:
                break
        self._proxy_port = ports["proxy_port"]
        if prep.returncode != 0:
            raise MilvusServerError(f"could not prepare the Milvus server config: {_last_line(prep.stderr)}")
        info = json.loads(prep.stdout.strip().splitlines()[-1])
        self.version = info["version"]
        configs = Path(info["configs"])
        self._point_etcd_at(configs, ports["etcd_port"], peer_port)
        exe = Path(info["exe"])
        env = dict(
            os.environ,
            DEPLOY_MODE="STANDALONE",
            METRICS_PORT=str(self.metrics_port),
            MILVUS_RUN_DIR=str(self.data_dir / "run"),
            MILVUSCONF=f"{configs}/",
            LD_LIBRARY_PATH=":".join(p for p in (str(exe.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p),
        )
        logs = Path(info["logs"])
        self._logs = [open(logs / "milvus-stdout.log", "ab"), open(logs / "milvus-stderr.log", "ab")]
        t0 = time.monotonic()
        self.process = subprocess.Popen(
            [str(exe), "run", "standalone"],
            cwd=self.data_dir,
            env=env,
            stdout=self._logs[0],
            stderr=self._logs[1],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.port = ports["proxy_port"]
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self.uri

    def _point_etcd_at(self, configs: Path, client_port: int, peer_port: int) -> None:
        embed = configs / "embedEtcd.yaml"
        embed.write_text(
            "name: hcqr-milvus\n"
            f"listen-client-urls: http://127.0.0.1:{client_port}\n"
            f"advertise-client-urls: http://127.0.0.1:{client_port}\n"
            f"listen-peer-urls: http://127.0.0.1:{peer_port}\n"
            f"initial-advertise-peer-urls: http://127.0.0.1:{peer_port}\n"
            f"initial-cluster: hcqr-milvus=http://127.0.0.1:{peer_port}\n",
            encoding="utf-8",
        )
        yaml_path = configs / "milvus.yaml"
        text = yaml_path.read_text(encoding="utf-8")
        if text.count("\netcd:\n") != 1:
            raise MilvusServerError(f"{yaml_path}: no single top-level 'etcd:' section to point at {embed}")
        yaml_path.write_text(text.replace("\netcd:\n", f"\netcd:\n  config:\n    path: {embed}\n", 1), encoding="utf-8")

    def _wait_ready(self, t0: float) -> None:
        from pymilvus import MilvusClient

        health = f"http://127.0.0.1:{self.metrics_port}/healthz"
        last = "no answer"
        while time.monotonic() - t0 < self.startup_timeout:
            if self.process.poll() is not None:
                raise MilvusServerError(
                    f"the Milvus server exited with code {self.process.returncode} while starting: {self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(health, timeout=2) as resp:
                    if b"OK" in resp.read():
                        client = MilvusClient(uri=self.uri, token=self.token or "", timeout=10)
                        client.list_collections()
                        client.close()
                        return
            except Exception as exc:  # not up yet: connection refused, 503, a client not ready
                last = f"{type(exc).__name__}: {_last_line(str(exc))}"
            time.sleep(0.25)
        raise MilvusServerError(
            f"the Milvus server did not answer within {self.startup_timeout:.0f} s (last: {last}); {self._log_tail()}"
        )

    def _log_tail(self) -> str:
        for name in ("milvus-stderr.log", "milvus-stdout.log"):
            f = self.log_folder / name if self.log_folder else None
            if f and f.is_file() and f.stat().st_size:
                lines = [ln for ln in f.read_text(errors="replace").splitlines() if ln.strip()]
                return f"last log line of {f}: {lines[-1][:300] if lines else ''}"
        return "its log is empty"

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server and every process of its process group; remove its data folder if it made one.

        SIGTERM first, SIGKILL after ``timeout`` seconds. Safe to call twice.
        """
        proc, self.process = self.process, None
        process_group.stop_group(proc, timeout, MilvusServerError, "the Milvus server")
        for fh in self._logs:
            fh.close()
        self._logs = []
        self.port = None
        if self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None


def running_or_skip(server: LocalMilvusServer):
    """Start ``server`` and give its address, stopping it on the way out; when it cannot start, skip the test
    that asked for it, saying why (:func:`support.process_group.running_or_skip`)."""
    return process_group.running_or_skip(server, MilvusServerError, "the Milvus server")


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"
