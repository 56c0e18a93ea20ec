"""Joining a Ray cluster, or starting one of our own on this machine: the one place batch jobs and the Ray
Serve server do it."""

from __future__ import annotations

import os
import signal
import threading

LOCAL_OBJECT_STORE = 256 * 2**20  # what we pass through it is small (rows of JSON, HTTP bodies), never models


def connect(address: str | None, cpus: int) -> bool:
    """Connect this process to Ray unless it already is; returns whether it connected here (and so should
    disconnect). Without an address, a cluster of its own ("local": never one that `ray start` left running
    here, whose CPUs and object store were sized for something else) declaring at least `cpus` logical CPUs."""
    import ray

    if ray.is_initialized():
        return False
    in_main_thread = threading.current_thread() is threading.main_thread()
    on_sigterm = signal.getsignal(signal.SIGTERM) if in_main_thread else None
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=max(cpus, os.cpu_count() or 1), object_store_memory=LOCAL_OBJECT_STORE,
                 include_dashboard=False, log_to_driver=False)
    if on_sigterm is not None:  # Ray's own handlers would abort the process (its core's signal handler) or exit
        signal.signal(signal.SIGTERM, on_sigterm)  # at once: the caller's handler runs its cleanup, Ray's shutdown too
    return True
