"""examples/python/torch_energy_attention.py, on a reduced budget (the full run's
figures are in docs/python.md)."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip(
    "torch", reason="PyTorch is not installed (Debian: python3-torch); the example needs it")


def test_the_example_trains_both_attentions_and_reports_them(source_dir):
    example = source_dir / "examples" / "python" / "torch_energy_attention.py"
    process = subprocess.run(
        [sys.executable, str(example), "--steps", "12", "--eval-every", "6", "--threads", "1"],
        capture_output=True, text=True, env=dict(os.environ), timeout=240)
    assert process.returncode == 0, process.stderr
    rows = re.findall(r"^(\S+(?:\(\w+\))?)\s+(\d+\.\d\d)%\s+(\d+\.\d)$", process.stdout, re.M)
    assert [name for name, _, _ in rows] == [
        "stillpoint.torch.EnergyAttention(probabilistic)", "torch.nn.MultiheadAttention"]
    for _, accuracy, ms in rows:
        assert 0 <= float(accuracy) <= 100 and float(ms) > 0
    assert "step 12/12" in process.stdout
