"""Ports for a one-node spmd job: drawn below the kernel's ephemeral range (where no outgoing
connection or bind(0) of another process can take them before the workers bind), free now, and
never handed to two jobs of one process."""

import socket

import pytest

from xbench.errors import XbenchError
from xbench.run import cluster


def test_a_block_lies_below_the_ephemeral_range_and_can_be_bound(monkeypatch, tmp_path):
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t60999\n")
    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE", str(setting))
    for _ in range(20):
        start = cluster.free_port_block(4)
        assert cluster.LOWEST_PORT <= start and start + 4 <= 40000
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", start + 3))


def test_blocks_handed_out_do_not_overlap():
    blocks = [set(range(start, start + 8)) for start in (cluster.free_port_block(8) for _ in range(30))]
    assert sum(map(len, blocks)) == len(set().union(*blocks))


def test_a_port_in_use_is_not_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(cluster, "_choosable_ports", lambda count: (port, port + 1))
        with pytest.raises(XbenchError, match="found no 1 free consecutive local ports"):
            cluster.free_port_block(1, attempts=5)


def test_an_unreadable_or_unusual_setting_falls_back(monkeypatch, tmp_path):
    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE", str(tmp_path / "absent"))
    assert cluster._choosable_ports(2) == (cluster.LOWEST_PORT, 32766)
    setting = tmp_path / "low"
    setting.write_text("1024 65535")
    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE", str(setting))
    assert cluster._choosable_ports(2) == (1024, 65534)
