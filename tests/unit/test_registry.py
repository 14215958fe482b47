import pytest

from tests.conftest import entry_point
from xbench.errors import BackendError
from xbench.run import registry


def test_builtin_backends_are_registered_as_entry_points():
    names = {p.name: p.value for p in registry.list_entry_points()}
    assert names["jax"] == "xbench_backends.jax.pmap:JaxPmapBackend"
    assert names["tf"] == "xbench_backends.tf.mirrored:TfMirroredBackend"


def test_a_plugin_entry_point_is_loaded_and_probed():
    entries = registry.load_points([entry_point("numpy", "tests.support.fakes:NumpyBackend")])
    assert entries["numpy"].usable and entries["numpy"].availability.version


def test_a_broken_plugin_is_unavailable_with_its_reason():
    with pytest.warns(RuntimeWarning, match="'ghost'.*failed to load"):
        entries = registry.load_points([entry_point("ghost", "no_such_module_xyz:Backend")])
    entry = entries["ghost"]
    assert not entry.usable and "ModuleNotFoundError" in entry.availability.reason


def test_a_plugin_missing_part_of_the_contract_is_unavailable():
    with pytest.warns(RuntimeWarning, match="lacks run"):
        entries = registry.load_points([entry_point("incomplete", "tests.support.fakes:IncompleteBackend")])
    assert not entries["incomplete"].usable


def test_a_plugin_registered_under_another_name_is_refused():
    with pytest.warns(RuntimeWarning, match="registered as 'other'"):
        entries = registry.load_points([entry_point("other", "tests.support.fakes:NumpyBackend")])
    assert not entries["other"].usable


def test_duplicate_registrations_keep_the_first():
    with pytest.warns(RuntimeWarning, match="registered twice"):
        points = registry.unique_points([
            entry_point("numpy", "tests.support.fakes:NumpyBackend"),
            entry_point("numpy", "tests.support.fakes:MissingFrameworkBackend"),
        ])
    assert registry.Registry(list(points.values()))["numpy"].target == "tests.support.fakes:NumpyBackend"


def test_resolve_unknown_and_not_installed(fake_backends):
    with pytest.raises(BackendError, match="unknown backend 'nope'; available: .*jax"):
        registry.resolve(["nope"])
    with pytest.raises(BackendError, match=r"backend 'missing' cannot run here: .*pip install 'xbench\[missing\]'"):
        registry.resolve(["missing"])


def test_no_names_means_every_usable_backend(fake_backends):
    names = [entry.name for entry in registry.resolve([])]
    assert {"jax", "tf", "numpy"} <= set(names) and "missing" not in names


# -- the contract's optional abilities ----------------------------------------------------------


def test_abilities_are_found_by_their_methods():
    from tests.support.fakes import NumpyBackend, NumpyMlpBackend, SpmdNumpyBackend
    from xbench.contract import AllReduceCapable, SpmdCapable, ValidatesOptions, Verifiable

    assert isinstance(NumpyMlpBackend(), Verifiable) and not isinstance(NumpyBackend(), Verifiable)
    assert isinstance(SpmdNumpyBackend(), SpmdCapable) and isinstance(SpmdNumpyBackend(), AllReduceCapable)
    assert not isinstance(NumpyBackend(), SpmdCapable) and isinstance(NumpyBackend(), ValidatesOptions)


def test_an_ability_set_to_none_is_absent_and_named_as_missing():
    from xbench.contract import Verifiable, missing_methods

    class HalfVerifiable:
        gradients = None

        def train(self, prepared, steps):
            return []

    assert not isinstance(HalfVerifiable(), Verifiable)
    assert missing_methods(HalfVerifiable(), Verifiable) == ["gradients", "replica_weights"]


def test_declarations_have_their_defaults():
    from tests.support.fakes import NumpyBackend, NumpyMlpBackend, SpmdNumpyBackend
    from xbench.contract import DATA_PARALLEL, PLAIN, families_of, launchers_of, programs_of, variants_of

    plain = NumpyBackend()
    assert (programs_of(plain), variants_of(plain), families_of(plain), launchers_of(plain)) == (
        (DATA_PARALLEL,), {}, ("mlp",), ("subprocess",))
    assert programs_of(NumpyMlpBackend()) == (DATA_PARALLEL, PLAIN) and "bf16" in variants_of(NumpyMlpBackend())
    assert launchers_of(SpmdNumpyBackend()) == ("spmd",)


def test_the_old_contract_names_are_still_exported():
    import xbench.contract as contract

    old = ("ADAM", "AS_WRITTEN", "COMPILE_CACHE_VARIABLE", "DATA_PARALLEL", "LAUNCHERS", "PLAIN", "PROGRAMS", "Adam",
           "Availability", "Backend", "DeviceInfo", "DeviceUnavailable", "ModelSpec", "Prepared", "PreparedInfo",
           "Process", "TimingProtocol", "Trial", "Unsupported", "Variant", "Work", "backend_label",
           "backend_of_implementation", "families_of", "hash_arrays", "hash_weights", "implementation",
           "implementation_of", "launchers_of", "probe_distributions", "programs_of", "replicate_id", "trial_id",
           "variants_of")
    assert [name for name in old if name not in contract.__all__ or not hasattr(contract, name)] == []


def test_a_plugin_cannot_replace_a_built_in_backend_whatever_the_order():
    """Installed packages come in no set order; the built-in jax keeps its name."""
    built_in = entry_point("jax", "xbench_backends.jax.pmap:JaxPmapBackend")
    impostor = entry_point("jax", "tests.support.fakes:NumpyBackend")
    for points in ([impostor, built_in], [built_in, impostor]):
        with pytest.warns(RuntimeWarning, match="'jax' from tests.support.fakes:NumpyBackend is ignored: 'jax' is a "
                                                "built-in backend"):
            unique = registry.unique_points(points)
        assert unique["jax"].value == built_in.value
