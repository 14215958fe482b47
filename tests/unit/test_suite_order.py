"""The suite's own schedule names modules that exist (a renamed one would fall to the end of
the order unnoticed, and start late)."""

from tests.conftest import LONGEST_FIRST, ROOT


def test_every_module_the_order_names_exists_once():
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [path for path in LONGEST_FIRST if not (ROOT / "tests" / path).is_file()] == []
