"""Ports for a one-node spmd job: drawn below the kernel's ephemeral range (where no outgoing
connection or bind(0) of another process can take them before the workers bind), free now, and
never handed to two jobs of one process."""

import socket

import pytest

from xbench.errors import XbenchError
from xbench.run import cluster


@pytest.fixture(autouse=True)
def nothing_handed_out(monkeypatch):
    monkeypatch.setattr(cluster, "_HANDED_OUT", {})


def _range_file(tmp_path, monkeypatch, text: str) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text(text)
    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE", str(setting))


def test_a_block_lies_below_the_ephemeral_range_and_can_be_bound(monkeypatch, tmp_path):
    _range_file(tmp_path, monkeypatch, "30000\t60999\n")
    for _ in range(20):
        start = cluster.free_port_block(4)
        assert cluster.LOWEST_PORT <= start and start + 4 <= 30000
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", start + 3))


def test_a_block_handed_out_is_not_handed_out_again(monkeypatch):
    start = cluster.free_port_block(8)
    monkeypatch.setattr(cluster, "_choosable_ports", lambda count: (start - 7, start + 8))  # every block overlaps
    with pytest.raises(XbenchError, match=f"found no 8 free consecutive local ports in {start - 7}"):
        cluster.free_port_block(8, attempts=50)


def test_a_port_in_use_is_not_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(cluster, "_choosable_ports", lambda count: (port, port + 1))
        with pytest.raises(XbenchError, match="found no 1 free consecutive local ports"):
            cluster.free_port_block(1, attempts=5)


def test_an_unreadable_or_low_setting_still_draws_below_it(monkeypatch, tmp_path):
    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE", str(tmp_path / "absent"))
    assert cluster._choosable_ports(2) == (cluster.LOWEST_PORT, 32767)
    _range_file(tmp_path, monkeypatch, "8000 60999")
    assert cluster._choosable_ports(2) == (1024, 7999)
    _range_file(tmp_path, monkeypatch, "1024 65535")
    assert cluster._choosable_ports(2) == (1024, 65535)
