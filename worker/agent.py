"""The torchrun agent of a one-node job, listening on loopback only: `python -m worker.agent ARGS`.

launcher.launch starts it (the flow process never imports torch); with several nodes the launcher
runs torch.distributed.run itself with the user's rendezvous arguments.
"""

from __future__ import annotations

import os
import socket
import sys

LOOPBACK = "127.0.0.1"


def loopback_torchrun(args: list[str]) -> None:
    """`python -m worker.agent ARGS`: torchrun ARGS on this node alone, listening on 127.0.0.1 only.

    A torchrun store listens on every interface whatever host it is given (measured on torch 2.13:
    `--standalone`, `--rdzv-endpoint 127.0.0.1:P` and `--master-addr 127.0.0.1` all gave [::]:P), so
    the agent's only store (static rendezvous, one node) is handed a socket already listening on
    127.0.0.1 (TCPStore's master_listen_fd). The port is bound here and held until the store takes
    it, so concurrent runs cannot race for it. The ranks reach the store at MASTER_ADDR=127.0.0.1;
    gloo (and NCCL's bootstrap) would listen on the address the hostname resolves to, so both are
    pinned to the loopback interface unless the caller set them. Linux names it `lo`.
    """
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static
    from torch.distributed import TCPStore
    from torch.distributed.run import main as torchrun_main

    listener = socket.create_server((LOOPBACK, 0))
    port = listener.getsockname()[1]

    def store_on_listener(host, port, world_size, is_master, *rest, **kwargs):  # the agent builds it once
        if is_master:
            kwargs["master_listen_fd"] = listener.detach()
        return TCPStore(host, port, world_size, is_master, *rest, **kwargs)

    if static.TCPStore is not TCPStore:  # fail loudly rather than listen on [::] if torch changes this
        raise RuntimeError("torch's static rendezvous no longer builds torch.distributed.TCPStore")
    static.TCPStore = store_on_listener
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        os.environ.setdefault(var, "lo")
    torchrun_main(["--nnodes", "1", "--master-addr", LOOPBACK, "--master-port", str(port), *args])


if __name__ == "__main__":
    loopback_torchrun(sys.argv[1:])
