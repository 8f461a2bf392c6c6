"""The torchrun agent of a job whose nodes are all this machine, listening on loopback only.

`python -m worker.agent ARGS`: one node. `python -m worker.agent --nodes N --node-rank R
--master-port P [--listen-fd FD] -- ARGS`: node R of N simulated nodes on this machine (a CPU
"cluster" of several nodes), node 0's agent holding the store on the socket the launcher bound.
launcher.launch starts it (the flow process never imports torch); with several real nodes the
launcher runs torch.distributed.run itself with the user's rendezvous arguments.
"""

from __future__ import annotations

import os
import socket
import sys

LOOPBACK = "127.0.0.1"


def loopback_torchrun(args: list[str], nodes: tuple[int, int, int, int | None] | None = None) -> None:
    """torchrun ARGS listening on 127.0.0.1 only: this node alone, or node R of `nodes` = (N, R, port, fd).

    A torchrun store listens on every interface whatever host it is given (measured on torch 2.13:
    `--standalone`, `--rdzv-endpoint 127.0.0.1:P` and `--master-addr 127.0.0.1` all gave [::]:P), so
    the agent's only store (static rendezvous; node 0's with several nodes) is handed a socket already
    listening on 127.0.0.1 (TCPStore's master_listen_fd). One node: the port is bound here; several:
    the launcher bound it and passed it to node 0 as `fd` (the other nodes connect to that port), so
    concurrent runs cannot race for it. The ranks reach the store at MASTER_ADDR=127.0.0.1; gloo (and
    NCCL's bootstrap) would listen on the address the hostname resolves to, so both are pinned to the
    loopback interface unless the caller set them. Linux names it `lo`. Static rendezvous numbers
    global ranks node-major (node_rank × nproc + local_rank), as launcher.launch's several-node path.
    """
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static
    from torch.distributed import TCPStore
    from torch.distributed.run import main as torchrun_main

    if nodes is None:
        listener: socket.socket | None = socket.create_server((LOOPBACK, 0))
        num_nodes, node_rank, port = 1, 0, listener.getsockname()[1]
    else:
        num_nodes, node_rank, port, fd = nodes
        listener = socket.socket(fileno=fd) if fd is not None else None

    def store_on_listener(host, port, world_size, is_master, *rest, **kwargs):  # the agent builds it once
        if is_master:
            assert listener is not None, "node 0 needs the launcher's listening socket (--listen-fd)"
            kwargs["master_listen_fd"] = listener.detach()
        return TCPStore(host, port, world_size, is_master, *rest, **kwargs)

    if static.TCPStore is not TCPStore:  # fail loudly rather than listen on [::] if torch changes this
        raise RuntimeError("torch's static rendezvous no longer builds torch.distributed.TCPStore")
    static.TCPStore = store_on_listener
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        os.environ.setdefault(var, "lo")
    rdzv = ["--nnodes", str(num_nodes), "--master-addr", LOOPBACK, "--master-port", str(port)]
    if num_nodes > 1:
        rdzv += ["--node-rank", str(node_rank)]
    torchrun_main([*rdzv, *args])


def parse_nodes(argv: list[str]) -> tuple[tuple[int, int, int, int | None] | None, list[str]]:
    """(N, R, port, fd) from `--nodes N --node-rank R --master-port P [--listen-fd FD] --`, and the rest."""
    if not argv or argv[0] != "--nodes":
        return None, argv
    end = argv.index("--")
    opts = dict(zip(argv[:end:2], argv[1:end:2], strict=True))
    fd = opts.get("--listen-fd")
    nodes = (int(opts["--nodes"]), int(opts["--node-rank"]), int(opts["--master-port"]), int(fd) if fd else None)
    return nodes, argv[end + 1 :]


if __name__ == "__main__":
    _nodes, _args = parse_nodes(sys.argv[1:])
    loopback_torchrun(_args, _nodes)
