"""stillpoint.generate: the `generate` command on a tiny text run, in-process."""
import pytest

import stillpoint


@pytest.fixture
def text_run(tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("the cat sat on a mat. " * 60)
    config = tmp_path / "text.yaml"
    config.write_text(
        "seed: 0\nthreads: 1\n"
        f"task: {{kind: text, path: {book}, context: 8}}\n"
        "model: {kind: implicit, dim: 8, heads: 2, hidden: 16, max_length: 8}\n"
        "train: {steps: 4, batch_size: 4, eval_every: 4, log_every: 2}\n"
        "log: {progress: none}\n")
    stillpoint.train(config, log_dir=tmp_path / "run")
    return tmp_path / "run"


def test_generate_returns_the_continuation_and_its_solver_effort(text_run):
    first = stillpoint.generate(text_run, "the cat", tokens=12, seed=3)
    again = stillpoint.generate(text_run, "the cat", tokens=12, seed=3)
    assert first == {**again, "seconds": first["seconds"]}
    assert len(first["text"]) == 12
    assert set(first["text"]) <= set("the cat sat on a mat.")
    assert first["prompt_unknown"] == 0
    assert first["iterations_per_token"] > 0          # an implicit model
    unknown = stillpoint.generate(text_run, "the dog", tokens=2)
    assert unknown["prompt_unknown"] == 2              # 'd' and 'g', read as unknown


def test_generate_reads_incrementally_or_the_whole_window(text_run):
    # 7 prompt characters, then 11 more pushes; the window of 8 fills after
    # one and restarts from `keep` characters at each later push.
    steps = stillpoint.generate(text_run, "the cat", tokens=12, keep=7)
    assert steps["mode"] == "incremental" and steps["full_window_reason"] == ""
    assert steps["restarts"] == 10
    assert steps["positions"] == 7 + 11 + 10 * 7
    full = stillpoint.generate(text_run, "the cat", tokens=12, incremental=False)
    assert full["mode"] == "full_window"
    assert full["positions"] == 7 + 11 * 8
    with pytest.raises(ValueError, match="--keep must be in"):
        stillpoint.generate(text_run, "the", tokens=3, keep=8)


def test_generate_refuses_bad_input_with_value_error(text_run, tmp_path):
    with pytest.raises(ValueError, match="--tokens must be >= 1"):
        stillpoint.generate(text_run, "the", tokens=0)
    with pytest.raises(ValueError, match="--prompt is empty"):
        stillpoint.generate(text_run, "", tokens=3)
    with pytest.raises(ValueError, match="no checkpoint"):
        stillpoint.generate(tmp_path / "missing", "the", tokens=3)
