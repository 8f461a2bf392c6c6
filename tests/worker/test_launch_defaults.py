"""Network exposure by default: the torchrun launch and the Prefect UI server stay on this machine.

One node runs torchrun through worker.agent (loopback_torchrun): a static rendezvous whose store
listens on 127.0.0.1 only, on a port the launch itself holds — not `--standalone`, whose store
listens on every interface (tests/worker/test_loopback.py checks the sockets of a real job). Only an
explicit multi-node launch names a host. Every default host in the config, the launcher, the train
flow and the UI server is the loopback address.
"""

from __future__ import annotations

import inspect

import pytest

from launcher.launch import Launch, torchrun_command
from planner.specs.config import RunConfig

LOOPBACK = "127.0.0.1"


def test_single_node_launch_uses_the_loopback_rendezvous():
    cmd = torchrun_command(Launch(plan_path="p.json", run_dir="r", run_id="x"))
    assert cmd[1:3] == ["-m", "worker.agent"] and "--standalone" not in cmd
    assert not {"--master-addr", "--rdzv-endpoint", "--nnodes"} & set(cmd)  # launcher.launch adds them: 127.0.0.1


def test_every_default_address_is_loopback():
    from flows.requests import TrainRequest
    from flows.server import start_server

    assert Launch(plan_path="p", run_dir="r", run_id="x").rdzv_endpoint.startswith(f"{LOOPBACK}:")
    assert RunConfig().train.rdzv_endpoint.startswith(f"{LOOPBACK}:")
    assert RunConfig().ui.host == LOOPBACK
    assert inspect.signature(start_server).parameters["host"].default == LOOPBACK
    assert TrainRequest.model_fields["rdzv_endpoint"].default.startswith(f"{LOOPBACK}:")


def test_multi_node_launch_uses_only_the_address_it_was_given():
    launch = Launch(plan_path="p", run_dir="r", run_id="x", nnodes=2, node_rank=1, rdzv_endpoint="10.1.2.3:29400")
    cmd = torchrun_command(launch)
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--standalone" not in cmd
    assert cmd[cmd.index("--master-addr") + 1] == "10.1.2.3" and cmd[cmd.index("--master-port") + 1] == "29400"


@pytest.mark.parametrize("endpoint", ["10.1.2.3", ":29400", "host:port"])
def test_a_malformed_rendezvous_endpoint_is_refused(endpoint):
    from planner.errors import MeshplanError

    with pytest.raises(MeshplanError, match="HOST:PORT"):
        torchrun_command(Launch(plan_path="p", run_dir="r", run_id="x", nnodes=2, rdzv_endpoint=endpoint))
