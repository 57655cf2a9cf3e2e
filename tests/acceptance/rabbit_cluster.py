"""A private 3-node RabbitMQ cluster on this machine, for the scale-out tests.

Everything the nodes use is private: node names (``jobs<id>-N@localhost``), AMQP and
distribution ports picked free, an Erlang port mapper (epmd) on its own port, mnesia, log
and config folders, an enabled-plugins file (none) and an Erlang cookie under a temporary
HOME. The RabbitMQ service on 5672 (its node, epmd and files) is never touched. Every
process the cluster starts is stopped in :meth:`RabbitCluster.destroy`, however the tests
end.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
HOST = "localhost"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


@dataclass
class RabbitNode:
    """One node: its name, AMQP port and the ``rabbitmq-server`` process running it."""

    index: int
    name: str
    amqp_port: int
    dist_port: int
    base: Path
    env: dict[str, str]
    server: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}//"

    @property
    def log(self) -> Path:
        return self.base / "server.out"

    def start(self) -> None:
        """Start the Erlang VM and RabbitMQ in it (the first start boots a fresh node)."""
        if self.server is not None and self.server.poll() is None:
            return
        with self.log.open("ab") as out:
            self.server = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL the node's whole process group: a crash, not a shutdown."""
        if self.server is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.server.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.server.wait(10)
        self.server = None

    def alive(self) -> bool:
        return self.server is not None and self.server.poll() is None


@dataclass
class RabbitCluster:
    """Three (or more) clustered nodes; ``urls`` is a Celery failover list of all of them."""

    root: Path
    nodes: list[RabbitNode] = field(default_factory=list)
    epmd_port: int = 0
    base_env: dict[str, str] = field(default_factory=dict)
    epmd: subprocess.Popen[bytes] | None = None
    tag: str = ""
    made: int = 0
    size: int = 3

    @classmethod
    def create(cls, root: Path, size: int = 3) -> RabbitCluster:
        root.mkdir(parents=True, exist_ok=True)
        home = root / "home"
        home.mkdir(exist_ok=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        (root / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's: its NODENAME
        (root / "enabled_plugins").write_text("[].\n")
        epmd_port = free_port()
        base_env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RABBITMQ_", "ERL_"))
        }
        base_env.update(
            {
                "HOME": str(home),
                "ERL_EPMD_PORT": str(epmd_port),
                "ERL_EPMD_ADDRESS": "127.0.0.1",
                "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
                "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
                "RABBITMQ_USE_LONGNAME": "false",
            }
        )
        cluster = cls(root, [], epmd_port, base_env, tag=uuid.uuid4().hex[:6], size=size)
        for _ in range(size):
            cluster.nodes.append(cluster._new_node())
        return cluster

    def _new_node(self) -> RabbitNode:
        self.made += 1
        index = self.made
        base = self.root / f"node{index}"
        base.mkdir()
        amqp_port, dist_port = free_port(), free_port()
        name = f"jobs{self.tag}-{index}@{HOST}"
        config = base / "rabbitmq.conf"
        config.write_text(
            f"listeners.tcp.1 = 127.0.0.1:{amqp_port}\n"
            "loopback_users = none\n"
            "cluster_partition_handling = pause_minority\n"
            # quick to notice a dead peer: the tests stop nodes on purpose
            "net_ticktime = 10\n"
        )
        env = {
            **self.base_env,
            "RABBITMQ_NODENAME": name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(amqp_port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
            "RABBITMQ_LOGS": str(base / "log" / "rabbit.log"),
        }
        return RabbitNode(index, name, amqp_port, dist_port, base, env)

    # -- rabbitmqctl against our nodes, with our cookie and epmd --------------------------

    def ctl(self, node: RabbitNode, *args: str, timeout: float = 60, check: bool = True) -> str:
        done = subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.name, *args],
            env=node.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl -n {node.name} {' '.join(args)}: {done.stdout}{done.stderr}"
            )
        return done.stdout

    def wait_booted(self, node: RabbitNode, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(f"{node.name} exited:\n{node.log.read_text()[-3000:]}")
            done = subprocess.run(
                [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.name, "await_startup"],
                env=node.env,
                capture_output=True,
                text=True,
                timeout=max(5.0, deadline - time.monotonic()),
                check=False,
            )
            if done.returncode == 0 and port_open(node.amqp_port):
                return
            time.sleep(0.5)
        raise RuntimeError(f"{node.name} did not boot within {timeout:.0f}s")

    def start(self) -> None:
        """Boot the nodes and join the others to the first one."""
        # Our own port mapper, in the foreground, so that destroy() can stop it by its PID.
        self.epmd = subprocess.Popen(
            ["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            env=self.base_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            self.wait_booted(node)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", first.name)
            self.ctl(node, "start_app")
        for node in self.nodes:
            self.wait_booted(node)

    @property
    def urls(self) -> str:
        return ";".join(node.url for node in self.nodes)

    def running(self) -> list[RabbitNode]:
        return [node for node in self.nodes if node.alive()]

    def node(self, name: str) -> RabbitNode:
        return next(node for node in self.nodes if node.name == name)

    def stop_node(self, node: RabbitNode) -> None:
        """Stop a node the way a crash does (SIGKILL), not a graceful shutdown."""
        node.kill()

    def restart_node(self, node: RabbitNode) -> None:
        node.start()
        self.wait_booted(node)

    def forget(self, node: RabbitNode) -> None:
        """Lose ``node`` for good: killed, removed from the cluster by a live node."""
        node.kill()
        live = self.running()[0]
        self.ctl(live, "forget_cluster_node", node.name)
        self.nodes.remove(node)
        shutil.rmtree(node.base / "mnesia", ignore_errors=True)

    def queue_info(self, queue: str) -> dict[str, str]:
        """``rabbitmqctl list_queues`` columns for ``queue``, asked of a running node."""
        live = self.running()[0]
        out = self.ctl(
            live,
            "-q",
            "--no-table-headers",
            "list_queues",
            "name",
            "type",
            "leader",
            "messages_ready",
            "messages_unacknowledged",
            "state",
            timeout=30,
        )
        for line in out.splitlines():
            parts = line.split("\t")
            if parts and parts[0] == queue:
                keys = ("name", "type", "leader", "ready", "unacked", "state")
                return dict(zip(keys, parts, strict=False))
        return {}

    def leader(self, queue: str) -> RabbitNode:
        """The node leading a quorum queue, or the home node of a classic one."""
        info = self.queue_info(queue)
        leader = info.get("leader") or ""
        if not leader:
            out = self.ctl(
                self.running()[0], "-q", "--no-table-headers", "list_queues", "name", "pid"
            )
            for line in out.splitlines():
                name, _, pid = line.partition("\t")
                if name == queue:
                    node_part = pid.strip().removeprefix("<").split(".")[0]
                    leader = node_part
        found = [node for node in self.nodes if node.name == leader]
        if not found:
            raise AssertionError(f"no leader/home node for {queue!r}: {info}")
        return found[0]

    def add_node(self) -> RabbitNode:
        """A fresh node joined to the cluster (after one was lost for good)."""
        member = self.running()[0]
        node = self._new_node()
        self.nodes.append(node)
        node.start()
        self.wait_booted(node)
        self.ctl(node, "stop_app")
        self.ctl(node, "join_cluster", member.name)
        self.ctl(node, "start_app")
        self.wait_booted(node)
        return node

    def heal(self) -> None:
        """Every node running again, and as many nodes as the cluster started with."""
        for node in self.nodes:
            if not node.alive():
                self.restart_node(node)
        while len(self.nodes) < self.size:
            self.add_node()

    def destroy(self) -> None:
        for node in self.nodes:
            node.kill()
        if self.epmd is not None:
            self.epmd.kill()
            self.epmd.wait(10)
