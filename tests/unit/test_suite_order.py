"""The suite's own schedule names modules and tests that exist (a renamed one would fall to the
end of the order, or out of the waiting lane, unnoticed), and the waiting lane takes only the
tests that wait while the other workers take the rest."""

import ast
from types import SimpleNamespace

from tests.conftest import LONGEST_FIRST, ROOT, WAITING
from tests.support.waiting_lane import WaitingLaneScheduling, is_waiting


def test_every_module_the_order_names_exists_once():
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [path for path in LONGEST_FIRST if not (ROOT / "tests" / path).is_file()] == []


def test_every_waiting_test_exists_once():
    assert len(set(WAITING)) == len(WAITING)
    for entry in WAITING:
        module, _, test = entry.partition("::")
        path = ROOT / "tests" / module
        assert path.is_file(), entry
        functions = {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}
        assert not test or test in functions, entry


def test_a_test_is_waiting_by_module_or_by_name_whatever_its_parameters():
    waiting = ("process/test_a.py", "process/test_b.py::test_hangs")
    assert is_waiting("tests/process/test_a.py::test_any[x-1]", waiting)
    assert is_waiting("tests/process/test_b.py::test_hangs[on]", waiting)
    assert not is_waiting("tests/process/test_b.py::test_hangs_not", waiting)
    assert not is_waiting("tests/process/test_c.py::test_hangs", waiting)


class FakeNode:
    def __init__(self, name):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes):
        self.sent.append(indexes)

    def shutdown(self):
        self.shutting_down = True


def scheduled(collection, waiting, workers=3):
    """Each fake worker's tests, run to the end one at a time, and whether it was shut down."""
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=False),
                             getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None)
    scheduler = WaitingLaneScheduling(config)
    scheduler.waiting = waiting
    nodes = [FakeNode(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    done = {node: 0 for node in nodes}
    while not scheduler.tests_finished:
        for node in list(scheduler.nodes):
            sent = [i for batch in node.sent for i in batch]
            if done[node] < len(sent):
                scheduler.mark_test_complete(node, sent[done[node]])
                done[node] += 1
            elif node.shutting_down:  # its process ends: xdist takes it out of the nodes
                scheduler.remove_node(node)
    return {node.gateway.id: ([collection[i] for sent in node.sent for i in sent], node.shutting_down)
            for node in nodes}


def test_the_last_worker_takes_only_waiting_units_the_others_the_rest_first():
    collection = [f"tests/m{k}.py::test_{i}" for k in range(4) for i in range(3)] + ["tests/w.py::test_hangs"]
    got = scheduled(collection, ("m1.py::test_2", "w.py"))
    lane_tests, _ = got["gw2"]
    assert lane_tests == ["tests/m1.py::test_2", "tests/w.py::test_hangs"]
    computing = got["gw0"][0] + got["gw1"][0]
    assert sorted(computing) == sorted(set(collection) - set(lane_tests))
    # the module's other tests stay together, in a worker that computes
    module = {"tests/m1.py::test_0", "tests/m1.py::test_1"}
    assert any(module <= set(tests) for tests, _ in (got["gw0"], got["gw1"]))


def test_the_workers_that_compute_take_the_rest_once_the_lane_has_ended():
    # The lane's one test ends long before the modules that compute: the last worker left then
    # is still one that computes (it was once taken for the lane, and idled to the end).
    collection = [f"tests/m{k}.py::test_{i}" for k in range(8) for i in range(3)] + ["tests/w.py::test_hangs"]
    got = scheduled(collection, ("w.py",))
    assert got["gw2"] == (["tests/w.py::test_hangs"], True)
    assert len(got["gw1"][0]) >= 9 and len(got["gw0"][0]) >= 9, got


def test_a_lane_with_nothing_to_wait_for_ends_at_once():
    collection = [f"tests/m{k}.py::test_{i}" for k in range(4) for i in range(3)]
    got = scheduled(collection, ())
    assert got["gw2"] == ([], True)
