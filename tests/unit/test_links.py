"""--p2p on|off: parsed alike by every command, put into every worker's environment (and taken
out again), recorded with what it changed, and refused or explained in one line."""

from __future__ import annotations

import os

import pytest

from xbench.cli.main import main
from xbench.cli.options import p2p_list
from xbench.errors import SpecError
from xbench.experiment import build_spec
from xbench.results.links import NO_EFFECT, P2P_OFF, links_record, nccl_variables, notes, p2p_disabled, short
from xbench.run import links
from xbench.run.worker_process import worker_environment

GPU = {"simulated": False, "platform": "gpu", "available": 2}
ONE_GPU = {"simulated": False, "platform": "gpu", "available": 1}
CPU = {"simulated": True, "platform": "cpu", "available": 8}


def test_allreduce_takes_both_topologies_after_one_flag_each_once_in_order():
    assert p2p_list(None) == [True]
    assert p2p_list(["on", "off"]) == [True, False]
    assert p2p_list(["off,on", "off"]) == [False, True]
    with pytest.raises(SpecError, match="--p2p takes on, off"):
        p2p_list(["sideways"])


def test_the_spec_takes_p2p_as_a_toml_boolean_and_nothing_else():
    models = [{"preset": "medium", "batch_sizes": [32]}]
    assert build_spec({"models": models}).p2p is True
    assert build_spec({"models": models, "p2p": False}).p2p is False
    with pytest.raises(SpecError, match="'p2p' .* must be true or false"):
        build_spec({"models": models, "p2p": "off"})


def test_p2p_off_reaches_every_worker_environment_and_leaves_with_the_block(monkeypatch):
    monkeypatch.setenv("NCCL_SHM_DISABLE", "1")  # would send the traffic over the network, not host memory
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    with links.applied(False) as nccl:
        env = worker_environment()
        assert env["NCCL_P2P_DISABLE"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"
        assert "NCCL_SHM_DISABLE" not in env
        assert nccl == P2P_OFF
    assert os.environ["NCCL_SHM_DISABLE"] == "1"
    assert "NCCL_P2P_DISABLE" not in os.environ and "NCCL_NVLS_ENABLE" not in os.environ


def test_p2p_on_leaves_the_users_own_nccl_variables_and_the_record_names_them(monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    with links.applied(True) as nccl:
        assert os.environ["NCCL_P2P_DISABLE"] == "1"
    record = links_record(True, nccl, {"jax": GPU}, (1, 2))
    assert record["p2p"] == "off" and record["asked"] == "on"
    assert "in the environment" in record["turned_off_by"]


def test_the_fork_servers_key_holds_the_variables_so_no_server_started_without_them_serves_them(monkeypatch):
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    plain = nccl_variables(worker_environment())
    with links.applied(False):
        off = nccl_variables(worker_environment())
    assert plain != off  # ForkServers keys each server by (backend, its environment)


@pytest.mark.parametrize(("devices", "counts", "effect"), [
    ({"jax": CPU}, (1, 2), "nothing: simulated CPU devices"),
    ({"jax": ONE_GPU}, (1,), "nothing: one GPU"),
    ({"jax": GPU}, (1,), "nothing: one GPU"),
    ({"jax": GPU, "torch": GPU}, (1, 2), "GPU-to-GPU traffic through host memory"),
])
def test_what_p2p_off_changes_is_recorded_and_said_in_one_line(devices, counts, effect):
    record = links_record(False, dict(P2P_OFF), devices, counts)
    assert record["effect"].startswith(effect)
    said = notes(record)
    assert len(said) == 1 and "\n" not in said[0]
    assert (NO_EFFECT in short(record)) == effect.startswith("nothing")


def test_p2p_on_says_nothing_in_the_tables():
    record = links_record(True, {}, {"jax": GPU}, (1, 2))
    assert record["p2p"] == "on" and notes(record) == [] and short(record) == ""


def test_nccl_reads_any_nonzero_integer_as_disabled():
    assert p2p_disabled({"NCCL_P2P_DISABLE": "1"}) and p2p_disabled({"NCCL_P2P_DISABLE": "2"})
    assert not p2p_disabled({"NCCL_P2P_DISABLE": "0"}) and not p2p_disabled({}) and not p2p_disabled(
        {"NCCL_P2P_DISABLE": "yes"})


@pytest.mark.parametrize("command", [["compare"], ["verify"], ["sweep"], ["allreduce"]])
def test_a_bad_p2p_value_is_one_line_before_anything_runs(command, capsys):
    assert main([*command, "--p2p", "sideways"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "sideways" in err and "Traceback" not in err
