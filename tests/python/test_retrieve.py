"""stillpoint.retrieve: Hopfield retrieval on ndarrays, as `stillpoint retrieve`."""
import pathlib
import subprocess

import numpy as np
import pytest

import stillpoint

CLI = pathlib.Path(stillpoint.__file__).resolve().parents[2] / "bin" / "stillpoint"


def stored_and_corrupted(dtype, n=8, d=32, flips=6, seed=0):
    rng = np.random.default_rng(seed)
    patterns = rng.choice([-1.0, 1.0], size=(n, d)).astype(dtype)
    queries = patterns.copy()
    for row in queries:
        row[rng.choice(d, size=flips, replace=False)] *= -1
    return patterns, queries


def softmax_update(patterns, xi, beta):
    scores = beta * patterns @ xi
    weights = np.exp(scores - scores.max())
    return patterns.T @ (weights / weights.sum())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_corrupted_query_retrieves_its_pattern(dtype):
    patterns, queries = stored_and_corrupted(dtype)
    result = stillpoint.retrieve(patterns, queries, beta=8.0, tol=1e-6, max_iter=32)
    fixed = result["fixed_points"]
    assert fixed.shape == queries.shape and fixed.dtype == dtype
    assert result["nearest"].tolist() == list(range(len(patterns)))
    assert result["converged"].all() and set(result["status"]) == {"CONVERGED"}
    assert (result["iterations"] >= 1).all()
    for i, xi in enumerate(fixed.astype(np.float64)):
        # A fixed point of the update, to the tolerance asked for.
        update = softmax_update(patterns.astype(np.float64), xi, 8.0)
        assert np.linalg.norm(update - xi) <= 1e-5 * np.linalg.norm(update) + 1e-6
        assert result["residuals"][i] <= 1e-6
        # E(xi) = |xi|^2 / 2 - lse(beta X xi) / beta.
        scores = 8.0 * patterns.astype(np.float64) @ xi
        energy = xi @ xi / 2 - (scores.max() + np.log(np.exp(scores - scores.max()).sum())) / 8.0
        assert result["energy"][i] == pytest.approx(energy, rel=1e-4, abs=1e-4)


def test_the_iteration_budget_is_reported_not_hidden():
    patterns, queries = stored_and_corrupted(np.float64)
    result = stillpoint.retrieve(patterns, queries, beta=0.05, tol=1e-14, max_iter=1)
    assert (result["iterations"] == 1).all()
    assert not result["converged"].any()
    assert set(result["status"]) == {"MAX_ITERATIONS"}


@pytest.mark.skipif(not CLI.exists(), reason=f"the stillpoint program is not built ({CLI})")
def test_the_same_fixed_points_as_the_command(tmp_path):
    patterns, queries = stored_and_corrupted(np.float64, seed=4)
    np.savetxt(tmp_path / "patterns.csv", patterns, delimiter=",")
    np.savetxt(tmp_path / "queries.csv", queries, delimiter=",")
    subprocess.run([str(CLI), "retrieve", "--patterns", str(tmp_path / "patterns.csv"),
                    "--queries", str(tmp_path / "queries.csv"), "--beta", "2", "--dtype",
                    "float64", "--solver", "anderson", "--out", str(tmp_path / "out")],
                   check=True, capture_output=True)
    cli = np.loadtxt(tmp_path / "out" / "fixed_points.csv", delimiter=",")
    ours = stillpoint.retrieve(patterns, queries, 2.0, solver="anderson")["fixed_points"]
    # The command writes 9 significant digits.
    np.testing.assert_allclose(ours, cli, rtol=1e-8, atol=1e-8)


def test_bad_input_names_the_argument_and_the_expected_shape():
    patterns, queries = stored_and_corrupted(np.float32)
    with pytest.raises(ValueError, match=r"queries: expected shape \[Q, 32\] \(d = patterns.shape\[1\]\), got \(8, 31\)"):
        stillpoint.retrieve(patterns, queries[:, :31].copy(), 8.0)
    with pytest.raises(ValueError, match=r"patterns: expected shape \[N, d\], got \(256,\)"):
        stillpoint.retrieve(patterns.reshape(-1), queries, 8.0)
    with pytest.raises(TypeError, match="queries: expected a float32 array, got dtype float64"):
        stillpoint.retrieve(patterns, queries.astype(np.float64), 8.0)
    with pytest.raises(TypeError, match="patterns: expected a float32 or float64 array, got dtype int64"):
        stillpoint.retrieve(patterns.astype(np.int64), queries, 8.0)
    with pytest.raises(TypeError, match="patterns: expected a float32 or float64 numpy.ndarray"):
        stillpoint.retrieve(patterns.tolist(), queries, 8.0)
    with pytest.raises(ValueError, match="queries: the array of shape .* is not C-contiguous"):
        stillpoint.retrieve(patterns, np.asfortranarray(queries), 8.0)
    with pytest.raises(ValueError, match="beta: expected a positive finite number"):
        stillpoint.retrieve(patterns, queries, -1.0)
    with pytest.raises(ValueError, match="solver: unknown solver 'pickard' .*picard"):
        stillpoint.retrieve(patterns, queries, 8.0, solver="pickard")
    with pytest.raises(ValueError, match=r"max_iter: expected an integer in \[1, "):
        stillpoint.retrieve(patterns, queries, 8.0, max_iter=0)
    broken = queries.copy()
    broken[2, 3] = np.nan
    with pytest.raises(ValueError, match="queries: holds NaN or infinity"):
        stillpoint.retrieve(patterns, broken, 8.0)
