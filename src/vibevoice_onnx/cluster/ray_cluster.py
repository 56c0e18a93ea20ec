"""Joining a Ray cluster, or starting one of our own on this machine: the one place batch jobs and the Ray
Serve server do it.

A cluster of our own is reachable from this machine only. Ray runs whatever code a client sends it (its own
security guidance: never expose a cluster to a network you do not trust), and by default a cluster started with
`ray.init()` registers its node on the machine's network address and listens there and on every interface: the
GCS, the raylet's node and object managers, each worker's gRPC server, the dashboard and runtime-env agents and
the metrics servers. Ours registers its node on 127.0.0.1, and every one of them follows the node's address."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import threading

from ..errors import VibeVoiceError

LOCAL_OBJECT_STORE = 256 * 2**20  # what we pass through it is small (rows of JSON, HTTP bodies), never models
LOOPBACK = "127.0.0.1"
REACH_TIMEOUT = 5.0  # seconds a cluster's address has to answer: ray.init would retry for minutes, logging each try

# The environment the processes of a cluster started here inherit (ray.init starts the GCS, the raylet and the
# agents, and the raylet starts every worker, Serve's controller, proxy and replicas among them, with its own).
LOCAL_CLUSTER_ENVIRONMENT = {
    # Ray turns a node address of 127.0.0.1 back into the machine's network address (so that other nodes could
    # reach it), unless "clusters" are off, as they are by default on Windows and macOS: then the node is
    # 127.0.0.1 and Ray binds its servers there. The process starting the cluster reads this when Ray is
    # imported; it is set on the module too (_loopback_node)
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
# Set unless the user set them: Serve's controller kills an HTTP proxy that is not ready within 5 s, and
# serve.start, which waits 60 s for it, then fails with the proxy's ActorDiedError; on a loaded machine a proxy
# takes longer than 5 s to start (2 cores busy with a build: the bug report). It waits as long as serve.start
# does; a proxy that stops answering its health checks is given 30 s a check rather than 10
PATIENT_SERVE_ENVIRONMENT = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
}


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket's 127.0.0.1
    return (mapped or address).is_loopback


def connect(address: str | None, cpus: int) -> bool:
    """Connect this process to Ray unless it already is; returns whether it connected here (and so should
    disconnect). Without an address, a cluster of its own ("local": never one that `ray start` left running
    here, whose CPUs and object store were sized for something else) declaring at least `cpus` logical CPUs,
    on 127.0.0.1 only. With one, the cluster is someone else's and so are its addresses."""
    import ray

    if ray.is_initialized():
        return False
    in_main_thread = threading.current_thread() is threading.main_thread()
    on_sigterm = signal.getsignal(signal.SIGTERM) if in_main_thread else None
    if address:
        check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:  # Ray's "no running instance", a bad address
            raise VibeVoiceError(f"cannot join the Ray cluster at {address}: {str(e).strip().splitlines()[0]}") from None
    else:
        with _loopback_node():
            ray.init(address="local", num_cpus=max(cpus, os.cpu_count() or 1), object_store_memory=LOCAL_OBJECT_STORE,
                     include_dashboard=False, log_to_driver=False, _node_ip_address=LOOPBACK)
        node = ray.util.get_node_ip_address()
        if not is_loopback(node):  # a Ray that no longer honours the setting: never leave such a cluster running
            ray.shutdown()
            raise VibeVoiceError(f"Ray started its node on {node}, not on {LOOPBACK}: refusing to run a cluster "
                                 f"reachable from the network (this Ray {ray.__version__} is not one we support)")
    if on_sigterm is not None:  # Ray's own handlers would abort the process (its core's signal handler) or exit
        signal.signal(signal.SIGTERM, on_sigterm)  # at once: the caller's handler runs its cleanup, Ray's shutdown too
    return True


def check_reachable(address: str) -> None:
    """One sentence where nothing answers at a cluster address of the form HOST:PORT or ray://HOST:PORT (Ray
    itself would retry for minutes); other forms ("auto") are left to Ray."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT).close()
    except OSError as e:
        raise VibeVoiceError(f"nothing answers at the Ray cluster address {address} ({e.strerror or e}): start the "
                             "cluster there (`ray start --head`), or leave --address out to run on a cluster of "
                             "this machine's own") from None


@contextlib.contextmanager
def _loopback_node():
    """While a local cluster starts: Ray's processes get LOCAL_CLUSTER_ENVIRONMENT (and PATIENT_SERVE_ENVIRONMENT
    where the user has not set those), and this process's Ray, imported already, takes node addresses on
    127.0.0.1 as they are; both as they were after."""
    import ray._private.ray_constants as ray_constants

    environment = {**PATIENT_SERVE_ENVIRONMENT, **{k: os.environ[k] for k in PATIENT_SERVE_ENVIRONMENT
                                                   if k in os.environ}, **LOCAL_CLUSTER_ENVIRONMENT}
    saved = {name: os.environ.get(name) for name in environment}
    clusters = ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(environment)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = clusters
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
