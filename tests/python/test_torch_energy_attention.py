"""stillpoint.torch.EnergyAttention: a torch.nn.Module over a C++ energy attention."""
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (Debian: python3-torch); stillpoint.torch needs it")

from stillpoint.torch import EnergyAttention  # noqa: E402

# The inner solve to near machine precision, so that central differences of
# the solved output measure the implicit gradient (the defaults stop at 1e-4).
TIGHT = {"forward": {"type": "anderson", "max_iterations": 400, "relative_tolerance": 1e-13},
         "backward": {"solver": "gmres", "max_iterations": 400, "tolerance": 1e-13}}

# Small blocks: gradcheck perturbs every input and parameter entry.
BLOCKS = {
    "hopfield": {},
    "probabilistic": {},
    "expfam": {},
    "energy_transformer": {"memories": 3},
}


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_gradcheck_in_float64_against_finite_differences(kind):
    torch.manual_seed(0)
    attention = EnergyAttention(kind, dim=4, heads=2, dtype=torch.float64, seed=3,
                                solver=TIGHT, **BLOCKS[kind])
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    parameters = [p for p in attention.parameters() if p.requires_grad]
    assert parameters

    def function(x, *unused):  # the parameters are the module's own (shared memory)
        return attention(x)

    assert torch.autograd.gradcheck(function, (x, *parameters), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_gradcheck_in_float64_at_the_defaults():
    # A float64 module's inner solves default to float64-sized tolerances
    # (model.attention_solver.* follow dtype), so it passes gradcheck without
    # any solver setting; and the solver report after a backward describes
    # that backward, not a later forward's (gradcheck runs many).
    torch.manual_seed(0)
    attention = EnergyAttention("probabilistic", 8, 2, dtype=torch.float64)
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: attention(x), (x,), eps=1e-6, atol=1e-5, rtol=1e-4)
    attention(x).sum().backward()
    _, backward = attention.solver_report()
    assert backward.startswith("ift/fixed_point: CONVERGED"), backward
    assert "0/0 converged" not in backward


def test_gradcheck_tells_an_inexact_gradient_from_the_implicit_one():
    # The same check with the Jacobian-free backward (jfb: dL/dz* passed
    # through one step of the map, no adjoint solve) must fail, or the check
    # above could not tell.
    jfb = {"forward": TIGHT["forward"], "backward": {"mode": "jfb"}}
    attention = EnergyAttention("probabilistic", dim=4, heads=2, dtype=torch.float64, seed=3,
                                solver=jfb)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert not torch.autograd.gradcheck(lambda x: attention(x), (x,), eps=1e-6, atol=1e-6,
                                        rtol=1e-4, raise_exception=False)


def test_the_parameters_are_the_blocks_memory():
    attention = EnergyAttention("probabilistic", dim=8, heads=2, seed=1)
    x = torch.randn(2, 5, 8)
    before = attention(x)
    assert before.abs().max() > 0
    shared = dict(zip([n for n, _, _ in attention._core.parameters()],
                      [a for _, a, _ in attention._core.parameters()]))
    names = attention.stillpoint_names()
    for attribute, parameter in attention.named_parameters():
        assert np.shares_memory(parameter.detach().numpy(), shared[names[attribute]])
    # The output is v* W_O: zero W_O through torch, and the C++ forward sees it.
    with torch.no_grad():
        for attribute, parameter in attention.named_parameters():
            if names[attribute] == "block.layer.wo.weight":
                parameter.zero_()
    assert torch.count_nonzero(attention(x)) == 0


def test_an_optimizer_step_moves_the_c_plus_plus_block():
    torch.manual_seed(1)
    attention = EnergyAttention("hopfield", dim=8, heads=2, seed=2)
    x = torch.randn(4, 6, 8)
    target = torch.randn(4, 6, 8)
    optimizer = torch.optim.Adam(attention.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(attention(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
    forward, backward = attention.solver_report()
    assert forward and backward


def test_bad_input_names_the_argument():
    attention = EnergyAttention("probabilistic", dim=8, heads=2)
    with pytest.raises(TypeError, match=r"x: expected dtype torch.float32"):
        attention(torch.zeros(2, 3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x: expected shape \[B, T, 8\], got \(2, 3, 7\)"):
        attention(torch.zeros(2, 3, 7))
    with pytest.raises(ValueError, match=r"x: expected shape \[B, T, 8\], got \(3, 8\)"):
        attention(torch.zeros(3, 8))
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        attention(np.zeros((2, 3, 8), dtype=np.float32))
    # A non-contiguous input is read through a contiguous copy.
    wide = torch.randn(2, 8, 3)
    assert torch.equal(attention(wide.transpose(1, 2)), attention(wide.transpose(1, 2).contiguous()))
    with pytest.raises(ValueError, match="bta"):
        EnergyAttention("hopfield", dim=8, heads=2, bta=1.0)
    with pytest.raises(ValueError, match="value_precision is read only by the probabilistic"):
        EnergyAttention("hopfield", dim=8, heads=2, value_precision=1.0)
    with pytest.raises(ValueError, match="unknown attention 'hopfeld'.*did you mean 'hopfield'"):
        EnergyAttention("hopfeld", dim=8, heads=2)
    with pytest.raises(ValueError, match=r"dim \(6\) must be a multiple of heads \(4\)"):
        EnergyAttention("hopfield", dim=6, heads=4)
    with pytest.raises(ValueError, match="max_iterations"):
        EnergyAttention("hopfield", dim=8, heads=2, solver={"forward": {"max_iterations": -1}})
    with pytest.raises(TypeError, match="dtype: expected torch.float32 or torch.float64"):
        EnergyAttention("hopfield", dim=8, heads=2, dtype=torch.int32)
    converted = EnergyAttention("hopfield", dim=8, heads=2).double()
    with pytest.raises(RuntimeError, match="no longer shares memory"):
        converted(torch.zeros(1, 2, 8, dtype=torch.float64))


def test_options_reach_the_block():
    slow = EnergyAttention("probabilistic", dim=8, heads=2,
                           solver={"forward": {"type": "picard", "max_iterations": 1}})
    slow(torch.randn(2, 4, 8))
    forward, _ = slow.solver_report()
    assert "1 iteration" in forward or "MAX_ITERATIONS" in forward, forward


def test_load_state_dict_copies_into_the_shared_memory():
    source = EnergyAttention("hopfield", dim=8, heads=2, seed=1)
    target = EnergyAttention("hopfield", dim=8, heads=2, seed=2)
    x = torch.randn(2, 3, 8)
    assert not torch.equal(source(x), target(x))
    target.load_state_dict(source.state_dict())
    assert torch.equal(source(x), target(x))
    target(x)  # still shares memory with its block (no RuntimeError)
