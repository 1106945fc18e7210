"""NumPy interop: stillpoint.Tensor shares memory with ndarrays both ways."""
import numpy as np
import pytest

import stillpoint


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_tensor_made_from_an_array_shares_its_memory(dtype):
    array = np.zeros((2, 3), dtype=dtype)
    tensor = stillpoint.Tensor(array)
    assert tensor.shape == (2, 3)
    assert tensor.dtype == np.dtype(dtype).name
    array[1, 2] = 7.5                      # written through NumPy ...
    assert tensor.tolist()[5] == 7.5       # ... read by C++ (Tensor::ToVector)
    tensor.fill(-1.25)                     # written by C++ ...
    assert np.all(array == -1.25)          # ... read through NumPy
    view = tensor.numpy()
    assert np.shares_memory(view, array)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_array_made_from_a_tensor_shares_its_memory_and_keeps_it_alive(dtype):
    tensor = stillpoint.Tensor.zeros([4], dtype)
    view = np.asarray(tensor)              # the buffer protocol
    other = tensor.numpy()                 # the explicit conversion
    assert view.dtype == np.dtype(dtype) and other.dtype == np.dtype(dtype)
    tensor.fill(3.0)
    assert view.tolist() == [3.0] * 4 and other.tolist() == [3.0] * 4
    other[0] = 9.0
    assert tensor.tolist()[0] == 9.0 and view[0] == 9.0
    del tensor                             # the arrays keep the storage
    assert other.tolist() == [9.0, 3.0, 3.0, 3.0]


def test_the_tensor_keeps_the_array_alive():
    tensor = stillpoint.Tensor(np.arange(6, dtype=np.float64).reshape(2, 3))
    import gc
    gc.collect()
    assert tensor.tolist() == [0, 1, 2, 3, 4, 5]


def test_wrong_dtype_non_contiguous_and_read_only_arrays_are_refused():
    with pytest.raises(TypeError, match=r"array: expected a float32 or float64 array, got dtype int64"):
        stillpoint.Tensor(np.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError, match=r"array: expected a float32 or float64 numpy.ndarray"):
        stillpoint.Tensor([1.0, 2.0])
    with pytest.raises(ValueError, match=r"array: the array of shape \(3, 2\) is not C-contiguous"):
        stillpoint.Tensor(np.zeros((2, 3), dtype=np.float32).T)
    with pytest.raises(ValueError, match=r"array: .* at most 4 dimensions"):
        stillpoint.Tensor(np.zeros((1, 1, 1, 1, 1), dtype=np.float32))
    frozen = np.zeros(3, dtype=np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        stillpoint.Tensor(frozen)
    with pytest.raises(TypeError, match="float32 or float64 array, got dtype >f8"):
        stillpoint.Tensor(np.zeros(3, dtype=">f8"))


def test_sequence_task_is_the_trainers_reverse_task():
    tokens, targets = stillpoint.sequence_task("reverse", length=6, vocab_size=5, examples=20,
                                               seed=3)
    assert tokens.shape == (20, 6) and targets.shape == (20, 6)
    assert tokens.dtype == np.int64
    assert np.array_equal(targets, tokens[:, ::-1])
    assert tokens.min() >= 0 and tokens.max() < 5
    again, _ = stillpoint.sequence_task("reverse", length=6, vocab_size=5, examples=20, seed=3)
    assert np.array_equal(tokens, again)
    with pytest.raises(ValueError, match="unknown sequence task 'revers'"):
        stillpoint.sequence_task("revers")


@pytest.mark.parametrize("shape", [[2**62, 4], [2**31, 2**31], [2**20, 2**20, 2**21]])
def test_a_shape_whose_size_overflows_is_refused(shape):
    # Item 12 of issue 48: the element count overflowed int64 (or the byte
    # count did) and the shape was accepted.
    with pytest.raises(ValueError, match="more than 1152921504606846976"):
        stillpoint.Tensor.zeros(shape)
