"""A pytest-xdist scheduler with a lane for the tests that mostly wait.

Some tests spend most of their wall time waiting on a bound (a hung worker's trial timeout, a
stopped fork server's start-up timeout) with the cores idle. In a worker of their own (the
lane: the last pytest-xdist worker) those waits overlap the tests that compute, which the
other workers run. Each module's tests stay one unit, as under `--dist loadfile`, except that
a module's waiting tests form a unit of their own. The lane takes only waiting units and ends
when none is left; the other workers take the rest first, then any waiting unit still queued.
It overrides LoadScopeScheduling's own methods (`schedule`, `_assign_work_unit`, `_reschedule`,
`_split_scope`), which are no public API: pyproject holds pytest-xdist below 4, and
tests/unit/test_suite_order.py drives it as xdist does.
"""

from __future__ import annotations

from collections.abc import Collection

from xdist.scheduler import LoadFileScheduling

WAITING_PREFIX = "waiting|"


def is_waiting(nodeid: str, waiting: Collection[str]) -> bool:
    """Whether `nodeid` ("tests/process/test_x.py::test_y[param]") is named in `waiting`, by
    module ("process/test_x.py") or by test ("process/test_x.py::test_y", every parameter)."""
    name = nodeid.removeprefix("tests/").split("[", 1)[0]
    module = name.split("::", 1)[0]
    return name in waiting or module in waiting


class WaitingLaneScheduling(LoadFileScheduling):
    def __init__(self, config, log=None, waiting: Collection[str] = ()) -> None:
        super().__init__(config, log)
        self.waiting = waiting

    def _split_scope(self, nodeid: str) -> str:
        module = super()._split_scope(nodeid)
        return WAITING_PREFIX + module if is_waiting(nodeid, self.waiting) else module

    def _is_lane(self, node) -> bool:
        # By the worker's name, fixed at the start: once the lane has ended and left the nodes,
        # the last of those left is no lane (a crashed worker's replacement is gw3 or later).
        return self.numnodes > 1 and node.gateway.id == f"gw{self.numnodes - 1}"

    def _next_scope(self, node) -> str | None:
        """The lane's next waiting unit; another worker's next computing unit, else waiting one."""
        waiting = [scope for scope in self.workqueue if scope.startswith(WAITING_PREFIX)]
        if self._is_lane(node):
            return waiting[0] if waiting else None
        computing = [scope for scope in self.workqueue if not scope.startswith(WAITING_PREFIX)]
        return (computing or waiting or [None])[0]

    def schedule(self) -> None:
        """xdist's, less the first step's trimming: that ends the workers beyond the number of
        units, whichever registered last, and could leave only the lane for a unit that
        computes. Here every worker is offered units, and one that gets none ends."""
        if self.collection is not None:  # a worker that joined later (a crashed one's replacement)
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        for nodeid in self.collection:  # in the suite's order (--no-loadscope-reorder)
            self.workqueue.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        for node in sorted(self.nodes, key=lambda n: not self._is_lane(n)):  # the lane first: its units
            self._reschedule(node)

    def _assign_work_unit(self, node) -> None:
        scope = self._next_scope(node)
        if scope is None:
            node.shutdown()
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])
        if self._next_scope(node) is None:
            # Nothing more will come: a worker holds its last test until told so (it may need
            # the next one for its teardown), and a unit of one test would wait for the end.
            node.shutdown()

    def _reschedule(self, node) -> None:
        """Keep more than two tests pending on `node` (xdist's low-water mark: it runs all but
        the last) while units are left for it; end it once none is."""
        while not node.shutting_down and self._pending_of(self.assigned_work[node]) <= 2:
            self._assign_work_unit(node)  # ends the worker when nothing more will come
        if not node.shutting_down and self._next_scope(node) is None:
            node.shutdown()
