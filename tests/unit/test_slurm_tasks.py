"""A SLURM allocation of several nodes never runs as one node, whatever its
tasks per node say; one node's batch script, which runs once, still may."""

import pytest

from xbench.errors import XbenchError
from xbench.run.cluster import resolve_launch

TWO_NODES = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODEID": "0"}


@pytest.mark.parametrize("tasks", ["4", "x", "2(x2)"])
@pytest.mark.parametrize("launcher", ["auto", "subprocess"])
def test_several_nodes_with_several_tasks_each_are_refused(tasks, launcher):
    with pytest.raises(XbenchError, match="2-node SLURM job; use --launcher spmd"):
        resolve_launch(launcher, env={**TWO_NODES, "SLURM_NTASKS_PER_NODE": tasks})


def test_spmd_names_the_tasks_per_node():
    with pytest.raises(XbenchError, match="SLURM_NTASKS_PER_NODE is '4': under SLURM run one xbench per node"):
        resolve_launch("spmd", env={**TWO_NODES, "SLURM_NTASKS_PER_NODE": "4"})


def test_one_nodes_batch_script_runs_as_one_process():
    env = {**TWO_NODES, "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS_PER_NODE": "4"}
    assert resolve_launch("auto", env=env).nnodes == 1
