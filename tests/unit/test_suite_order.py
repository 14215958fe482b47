"""The suite's own schedule names modules and tests that exist (a renamed one would fall to the
end of the order, or out of the waiting lane, unnoticed), and the waiting lane takes only the
tests that wait while the other workers take the rest."""

import ast
from types import SimpleNamespace

import pytest

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
        functions = {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}
        assert not test or test in functions, entry


def test_a_test_is_waiting_by_module_or_by_name_whatever_its_parameters():
    waiting = ("process/test_a.py", "process/test_b.py::test_hangs")
    assert is_waiting("tests/process/test_a.py::test_any[x-1]", waiting)
    assert is_waiting("tests/process/test_b.py::test_hangs[on]", waiting)
    assert not is_waiting("tests/process/test_b.py::test_hangs_not", waiting)
    assert not is_waiting("tests/process/test_c.py::test_hangs", waiting)


class FakeWorker:
    """A pytest-xdist worker as the scheduler sees it: it runs the tests it was sent in order,
    but holds its last one until more come or it is told to shut down (xdist's workers keep
    the next test for the teardown)."""

    def __init__(self, name):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []
        self.ran = 0

    def send_runtest_some(self, indexes):
        self.sent.extend(indexes)

    def shutdown(self):
        self.shutting_down = True

    def runnable(self) -> bool:
        return self.ran < len(self.sent) - (0 if self.shutting_down else 1)


def scheduled(collection, waiting, ready=(0, 1, 2)):
    """Each worker's tests, its workers ready in the order `ready` gives (the lane is gw2), run
    one test at a time as DSession drives them, until every worker has ended."""
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=False),
                             getvalue=lambda name: [f"{len(ready)}*popen"] if name == "tx" else None)
    scheduler = WaitingLaneScheduling(config, waiting=waiting)
    workers = {i: FakeWorker(f"gw{i}") for i in ready}
    for i in ready:
        scheduler.add_node(workers[i])
        scheduler.add_node_collection(workers[i], collection)
    scheduler.schedule()
    for _ in range(10 * len(collection) + 10):
        if not scheduler.nodes:
            break
        moved = False
        for worker in list(scheduler.nodes):
            if worker.runnable():
                scheduler.mark_test_complete(worker, worker.sent[worker.ran])
                worker.ran += 1
                moved = True
            elif worker.shutting_down and worker.ran == len(worker.sent):
                scheduler.remove_node(worker)  # its process ends
                moved = True
        if not moved:
            assert scheduler.tests_finished, "the run stalled with tests left"
            for worker in scheduler.nodes:
                worker.shutdown()  # DSession's end of the run
    else:
        pytest.fail("the run did not end")
    ran = {f"gw{i}": [collection[k] for k in worker.sent[:worker.ran]] for i, worker in workers.items()}
    assert sorted(sum(ran.values(), [])) == sorted(collection), ran  # each test once
    return ran


@pytest.mark.parametrize("ready", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
def test_the_last_worker_takes_only_waiting_units_the_others_the_rest(ready):
    collection = [f"tests/m{k}.py::test_{i}" for k in range(4) for i in range(3)] + ["tests/w.py::test_hangs"]
    ran = scheduled(collection, ("m1.py::test_2", "w.py"), ready)
    assert ran["gw2"] == ["tests/m1.py::test_2", "tests/w.py::test_hangs"]
    module = {"tests/m1.py::test_0", "tests/m1.py::test_1"}  # the rest of its module, together
    assert module <= set(ran["gw0"]) or module <= set(ran["gw1"]), ran


def test_the_workers_that_compute_take_the_rest_once_the_lane_has_ended():
    # The lane's one test ends long before the modules that compute: the last worker left then
    # is still one that computes (it was once taken for the lane, and idled to the end).
    collection = [f"tests/m{k}.py::test_{i}" for k in range(8) for i in range(3)] + ["tests/w.py::test_hangs"]
    ran = scheduled(collection, ("w.py",))
    assert ran["gw2"] == ["tests/w.py::test_hangs"]
    assert len(ran["gw1"]) >= 9 and len(ran["gw0"]) >= 9, ran


def test_a_worker_that_computes_takes_a_waiting_unit_the_busy_lane_left():
    collection = [f"tests/w1.py::test_{i}" for i in range(6)] + ["tests/w2.py::test_0", "tests/m.py::test_0"]
    ran = scheduled(collection, ("w1.py", "w2.py"))
    assert ran["gw2"] == collection[:6]
    assert sorted(ran["gw0"] + ran["gw1"]) == ["tests/m.py::test_0", "tests/w2.py::test_0"], ran


@pytest.mark.parametrize("ready", [(0, 1, 2), (2, 0, 1), (2, 1, 0)])
def test_one_unit_that_computes_runs_whichever_worker_was_ready_first(ready):
    ran = scheduled(["tests/m.py::test_0"], (), ready)
    assert ran["gw2"] == [] and ran["gw0"] + ran["gw1"] == ["tests/m.py::test_0"], ran


def test_a_lane_with_nothing_to_wait_for_ends_at_once():
    collection = [f"tests/m{k}.py::test_{i}" for k in range(4) for i in range(3)]
    assert scheduled(collection, ())["gw2"] == []
