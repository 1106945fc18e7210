"""The families' names come from the compiled module (made from the C++
lists), and each name is one the library builds."""
import pytest

import stillpoint
from stillpoint import _stillpoint


def test_attention_kinds_are_softmax_then_the_energy_blocks():
    assert stillpoint.attention_kinds() == ["softmax"] + stillpoint.energy_blocks()
    assert len(set(stillpoint.energy_blocks())) == len(stillpoint.energy_blocks())


def test_every_energy_block_builds_and_an_unknown_one_is_refused():
    for kind in stillpoint.energy_blocks():
        block = _stillpoint._EnergyAttention(kind, 8, 2, "float32", [], 0, False)
        assert block.name  # the C++ block's own name
    missing = stillpoint.energy_blocks()[0] + "_missing"
    with pytest.raises(Exception, match=missing):
        _stillpoint._EnergyAttention(missing, 8, 2, "float32", [], 0, False)


def test_model_kinds_and_position_schemes_are_the_keys_choices(tiny_config, tmp_path):
    kinds = stillpoint.model_kinds()
    schemes = stillpoint.position_schemes()
    assert len(set(kinds)) == len(kinds) and len(set(schemes)) == len(schemes)
    # A misspelt kind or scheme is refused with the key's choices: the list
    # is what the config reads.
    for key, names in (("model.kind", kinds), ("model.positions", schemes)):
        with pytest.raises(Exception) as error:
            stillpoint.train(tiny_config, [key + "=" + names[0] + "_missing"],
                             log_dir=tmp_path / "run")
        for name in names:
            assert name in str(error.value), (key, name, str(error.value))
