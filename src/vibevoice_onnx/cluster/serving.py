"""`vibevoice-onnx serve --ray`: the server's own FastAPI app (serve.create_app) as a Ray Serve deployment, its
replicas each holding every bundle, behind Ray's HTTP proxy on one address.

The app is built on each replica when it starts (Serve's ingress builder), so the routes, streaming, websockets
and errors are exactly those of `vibevoice-onnx serve`; Ray adds the replicas, routes each request to the least
busy one, restarts a replica that dies and, with autoscaling, adds replicas while requests queue. A replica
declares as many CPUs as its onnxruntime threads, so Ray never places more of them on a node than it has cores.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import VibeVoiceError
from .ray_cluster import connect, is_loopback

APPLICATION = "vibevoice"


@dataclass(frozen=True)
class Replicas:
    """A fixed count, or autoscaling between `least` and `most` on the requests each replica has going."""

    least: int = 1
    most: int = 1

    def __post_init__(self):
        if not 1 <= self.least <= self.most:
            raise VibeVoiceError(f"replicas: need 1 <= MIN <= MAX, got {self.least}:{self.most}")

    @property
    def autoscaling(self) -> bool:
        return self.least != self.most

    @classmethod
    def parse(cls, replicas: int | None, autoscale: str | None) -> "Replicas":
        if replicas is not None and autoscale is not None:
            raise VibeVoiceError("give --replicas N or --autoscale MIN:MAX, not both")
        if autoscale is None:
            return cls(replicas or 1, replicas or 1)
        least, sep, most = autoscale.partition(":")
        try:
            return cls(int(least), int(most)) if sep else cls(int(least), int(least))
        except ValueError:
            raise VibeVoiceError(f"--autoscale {autoscale}: give it as MIN:MAX replicas (e.g. 1:4)") from None

    def options(self, target_ongoing: int) -> dict:
        if not self.autoscaling:
            return {"num_replicas": self.least}
        # target: the generations a replica runs at once; beyond that, requests wait in its queue and Ray adds one
        return {"autoscaling_config": {"min_replicas": self.least, "max_replicas": self.most,
                                       "target_ongoing_requests": target_ongoing,
                                       "upscale_delay_s": 5, "downscale_delay_s": 60}}


def application(bundles: list[Path], settings, replicas: Replicas, threads: int, force: bool = False,
                aliases: dict[str, str] | None = None, shutdown_seconds: float = 10.0):
    """The Serve application: a deployment whose replicas each open `bundles` once, with `threads`
    onnxruntime threads, and serve `create_app` over them with `settings`."""
    from ray import serve

    paths = [str(Path(b).resolve()) for b in bundles]
    # Settings carries a threading.Event (set when the server stops): each replica makes its own
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name != "stopping"}

    def build_app():  # runs on each replica as it starts
        from vibevoice_onnx.cluster.serving import keep_replica_on_its_node
        from vibevoice_onnx.runtime.bundle import share_threads
        from vibevoice_onnx.serve import Models, Settings, create_app

        keep_replica_on_its_node()
        share_threads(threads)  # the replica's process runs our sessions and nothing else
        replica_settings = Settings(**fields)
        models = Models.open([Path(p) for p in paths], threads=threads, force=force, aliases=aliases,
                             max_batch=replica_settings.max_batch)
        return create_app(models, replica_settings)

    deployment = serve.deployment(
        serve.ingress(build_app)(), name=APPLICATION, ray_actor_options={"num_cpus": threads},
        # Ray sends a replica no more than it admits or queues itself (its own 429s stay as they are); what no
        # replica can take waits at Ray's router, up to max_queue, and beyond is refused with a 503
        max_ongoing_requests=settings.max_active + settings.max_queue, max_queued_requests=max(settings.max_queue, 1),
        graceful_shutdown_timeout_s=shutdown_seconds, **replicas.options(settings.max_active))
    return deployment.bind()


def run(bundles: list[Path], settings, replicas: Replicas, host: str = "127.0.0.1", port: int = 8000,
        address: str | None = None, threads: int | None = None, force: bool = False,
        aliases: dict[str, str] | None = None, shutdown_seconds: float = 10.0,
        log: Callable[[str], None] = print, ready: threading.Event | None = None,
        stop: threading.Event | None = None) -> None:
    """Deploy and serve until Ctrl-C or SIGTERM (or `stop` is set), then take the deployment down: running
    requests get `shutdown_seconds` to finish. Without `address`, on a local cluster started for it."""
    from ..serve.models import Models

    Models.check(bundles, threads, force, aliases)  # refuse here, once, what every replica would refuse
    threads = threads or max(1, len(os.sched_getaffinity(0)) // replicas.most)
    started_here = connect(address, cpus=replicas.most * threads)
    try:
        try:
            deploy(application(bundles, settings, replicas, threads, force, aliases, shutdown_seconds), host, port)
        except ray_failures() as e:
            reason = failure_reason(e)
            if "bind" in reason:  # the proxy's "Failed to bind to address '127.0.0.1:8000'"
                reason += " (is another server listening there?)"
            raise VibeVoiceError(f"Ray Serve did not start on {host}:{port}: {reason}") from None
        scale = f"{replicas.least}-{replicas.most} replicas (autoscaling)" if replicas.autoscaling else \
            f"{replicas.least} replica{'s' * (replicas.least > 1)}"
        log(f"serving on http://{host}:{port} with Ray Serve: {scale}, {threads} onnxruntime thread(s) each")
        if ready is not None:
            ready.set()
        (stop or threading.Event()).wait()  # Ctrl-C and SIGTERM arrive as exceptions in this (the main) thread
    finally:
        undeploy(started_here)


def deploy(app, host: str, port: int) -> None:
    """Start Serve's HTTP proxy on host:port (unless this cluster's Serve already runs) and the application
    behind it; returns once every replica is up."""
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=APPLICATION, route_prefix="/")


def undeploy(disconnect: bool) -> None:
    """Take our application down; on a cluster started here, Serve and the cluster with it."""
    import ray
    from ray import serve

    try:
        if disconnect:
            serve.shutdown()
        else:  # someone else's cluster: leave its Serve (and any other application) running
            serve.delete(APPLICATION)
    except ray_failures() as e:
        if not disconnect:
            raise VibeVoiceError(f"could not take the Ray Serve application '{APPLICATION}' down: "
                                 f"{failure_reason(e)}") from None
        # our own cluster, whose Serve did not start or is past stopping well: it goes down with the cluster
    finally:
        if disconnect:
            ray.shutdown()


def ray_failures() -> tuple[type[BaseException], ...]:
    """What Ray and Serve raise when they fail (an actor that died or was killed, a task that raised, a wait that
    timed out, an application that did not deploy), as against a mistake in our code."""
    from ray.exceptions import RayError
    from ray.serve.exceptions import RayServeException

    return RayError, RayServeException, TimeoutError, RuntimeError


def failure_reason(error: BaseException) -> str:
    """One line for what Ray raised, whose text is often a remote traceback over many lines."""
    import re

    from ray.exceptions import RayActorError, RayTaskError

    if isinstance(error, RayActorError):
        actor = re.search(r"class_name: (\w+)", str(error))
        name = {"ProxyActor": "HTTP proxy", "ServeController": "controller"}.get(actor and actor.group(1), "actor")
        how = "Ray killed it" if "ray.kill" in str(error) else "see the Ray logs"
        return f"its {name} died before it was ready ({how})"
    if isinstance(error, RayTaskError) and error.cause is not None:
        error = error.cause  # the exception raised in the actor (the proxy's "Failed to bind to address ...")
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    return next((line for line in lines if line), type(error).__name__).rstrip(".")


def keep_replica_on_its_node() -> None:
    """On a node whose address is 127.0.0.1 (a cluster started here), this replica's server for calls between
    deployments listens on 127.0.0.1 too: Serve binds it to every interface ("[::]:0") whatever the node's
    address, with no setting to change it, and it unpickles what it is sent. Elsewhere, and on a Serve without
    that server, nothing changes."""
    import ray
    from ray.serve._private import replica

    node = ray.util.get_node_ip_address()
    bind = getattr(replica, "add_port_to_grpc_server", None)
    if not is_loopback(node) or bind is None or getattr(bind, "keeps_to_node", False):
        return
    host = f"[{node}]" if ":" in node else node

    def add_port_on_node(server, address: str):
        wildcard, _, port = address.rpartition(":")
        return bind(server, f"{host}:{port}" if wildcard in ("[::]", "0.0.0.0") else address)

    add_port_on_node.keeps_to_node = True
    replica.add_port_to_grpc_server = add_port_on_node
