import numpy as np

from xbench.contract.work import build_work, hash_arrays, init_weights
from xbench.models.model_spec import PRESETS, ModelSpec


def preset(name):
    p = PRESETS[name]
    return ModelSpec(name=name, widths=p["widths"], dropout=p["dropout"], batch_sizes=p["batch_sizes"])


def test_true_parameter_counts_of_the_seed_models():
    # Not the seed's quoted 258,432 and 6,885,376 (the seed's counts do not match its own architecture).
    assert build_work(preset("medium"), 64, 0).params == 54_403
    assert build_work(preset("large"), 64, 0).params == 2_021_379


def test_work_is_deterministic_in_the_seed():
    a, b, c = (build_work(preset("medium"), 256, s) for s in (0, 0, 1))
    assert a.weights_hash == b.weights_hash and a.data_hash == b.data_hash
    assert a.weights_hash != c.weights_hash and a.data_hash != c.data_hash


def test_data_size_does_not_change_the_weights():
    assert build_work(preset("medium"), 64, 0).weights_hash == build_work(preset("medium"), 128, 0).weights_hash


def test_data_has_the_seed_generator_correlations():
    work = build_work(preset("medium"), 20_000, 0)
    corr = np.corrcoef(work.x[:, :3].T)
    assert abs(corr[0, 1] - 0.7 / np.sqrt(0.49 + 0.09)) < 0.02
    assert work.x.dtype == np.float32 and work.y.shape == (20_000, 3)


def test_shards_split_each_global_batch_by_device():
    work = build_work(preset("medium"), 100, 0)
    xs, ys = work.shards(global_batch=8, devices=2)
    assert xs.shape == (2, 12, 4, 50) and ys.shape == (2, 12, 4, 3)
    # Step 3's global batch is rows 24..31: device 0 takes 24..27, device 1 takes 28..31.
    np.testing.assert_array_equal(xs[0, 3], work.x[24:28])
    np.testing.assert_array_equal(xs[1, 3], work.x[28:32])


def test_hash_sees_shape_and_values():
    a = np.zeros((2, 3), np.float32)
    assert hash_arrays([a]) != hash_arrays([a.reshape(3, 2)])
    b = a.copy()
    b[0, 0] = 1e-7
    assert hash_arrays([a]) != hash_arrays([b])


def test_a_large_normal_array_is_drawn_in_chunks_the_same_whatever_the_threads(monkeypatch):
    """Chunks of DRAW_CHUNK values, each from a stream spawned in order, drawn on threads: the
    same values with one thread or many; small arrays come from the generator as before."""
    import xbench.models as models

    monkeypatch.setattr(models, "DRAW_CHUNK", 1000)
    small = models.normal(np.random.default_rng(7), 0.02, (10, 100))
    assert np.array_equal(small, (np.random.default_rng(7).standard_normal((10, 100), dtype=np.float32)
                                  * np.float32(0.02)))
    many = models.normal(np.random.default_rng(7), 0.02, (50, 99))
    monkeypatch.setattr(models, "usable_cores", lambda: 1)
    one = models.normal(np.random.default_rng(7), 0.02, (50, 99))
    assert many.dtype == np.float32 and many.shape == (50, 99) and np.array_equal(many, one)
    assert abs(float(many.std()) - 0.02) < 0.002 and len(np.unique(many)) == many.size
    first = np.random.default_rng(7).spawn(5)[0].standard_normal(1000, dtype=np.float32) * np.float32(0.02)
    assert np.array_equal(many.reshape(-1)[:1000], first)  # chunk 0 is the first spawned stream's


def test_a_large_array_is_hashed_by_its_blocks_the_same_whatever_the_threads(monkeypatch):
    import hashlib

    import xbench.contract.work as work
    import xbench.models as models

    small = np.arange(64, dtype=np.float32)
    plain = hashlib.sha256(b"<f4(64,)" + small.tobytes()).hexdigest()[:16]
    monkeypatch.setattr(work, "HASH_BLOCK", 1024)
    assert hash_arrays([small]) == plain  # under the block size: the bytes themselves, as before
    large = np.arange(1000, dtype=np.float32).reshape(10, 100)
    many = hash_arrays([large])
    monkeypatch.setattr(models, "usable_cores", lambda: 1)
    assert hash_arrays([large]) == many and hash_arrays([np.asfortranarray(large)]) == many
    changed = large.copy()
    changed[9, 99] = -1.0  # in the last, short block
    assert hash_arrays([changed]) != many and hash_arrays([large.reshape(100, 10)]) != many


def test_negative_zeros_become_positive_in_place_where_writable_else_in_a_copy():
    from xbench.contract.work import _positive_zeros

    writable = np.array([-0.0, 1.0, -2.0], dtype=np.float32)
    fixed = _positive_zeros(writable)
    assert np.shares_memory(fixed, writable) and not np.signbit(fixed[:2]).any() and fixed[2] == -2.0
    frozen = np.array([-0.0, 1.0], dtype=np.float32)
    frozen.flags.writeable = False
    copy = _positive_zeros(frozen)
    assert not np.shares_memory(copy, frozen) and not np.signbit(copy).any() and np.signbit(frozen[0])
    assert all(a.flags.writeable for a in init_weights(preset("medium"), 0))
