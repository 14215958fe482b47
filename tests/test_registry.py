import pytest

from xbench import registry
from xbench.errors import BackendError
from tests.conftest import entry_point


def test_builtin_backends_are_registered_as_entry_points():
    names = {p.name: p.value for p in registry.list_entry_points()}
    assert names["jax"] == "xbench_backends.jax.pmap:JaxPmapBackend"
    assert names["tf"] == "xbench_backends.tf.mirrored:TfMirroredBackend"


def test_a_plugin_entry_point_is_loaded_and_probed():
    entries = registry.load_entries([entry_point("numpy", "tests.fakes:NumpyBackend")])
    assert entries["numpy"].usable and entries["numpy"].availability.version


def test_a_broken_plugin_is_unavailable_with_its_reason():
    with pytest.warns(RuntimeWarning, match="'ghost'.*failed to load"):
        entries = registry.load_entries([entry_point("ghost", "no_such_module_xyz:Backend")])
    entry = entries["ghost"]
    assert not entry.usable and "ModuleNotFoundError" in entry.availability.reason


def test_a_plugin_missing_part_of_the_contract_is_unavailable():
    with pytest.warns(RuntimeWarning, match="lacks run"):
        entries = registry.load_entries([entry_point("incomplete", "tests.fakes:IncompleteBackend")])
    assert not entries["incomplete"].usable


def test_a_plugin_registered_under_another_name_is_refused():
    with pytest.warns(RuntimeWarning, match="registered as 'other'"):
        entries = registry.load_entries([entry_point("other", "tests.fakes:NumpyBackend")])
    assert not entries["other"].usable


def test_duplicate_registrations_keep_the_first():
    with pytest.warns(RuntimeWarning, match="registered twice"):
        entries = registry.load_entries([
            entry_point("numpy", "tests.fakes:NumpyBackend"),
            entry_point("numpy", "tests.fakes:MissingFrameworkBackend"),
        ])
    assert entries["numpy"].target == "tests.fakes:NumpyBackend"


def test_resolve_unknown_and_not_installed(fake_backends):
    with pytest.raises(BackendError, match="unknown backend 'nope'; available: .*jax"):
        registry.resolve(["nope"])
    with pytest.raises(BackendError, match=r"backend 'missing' cannot run here: .*pip install 'xbench\[missing\]'"):
        registry.resolve(["missing"])


def test_no_names_means_every_usable_backend(fake_backends):
    names = [entry.name for entry in registry.resolve([])]
    assert {"jax", "tf", "numpy"} <= set(names) and "missing" not in names
