"""stillpoint's energy attention as a PyTorch module (needs PyTorch; CPU tensors).

    from stillpoint.torch import EnergyAttention
    attention = EnergyAttention("probabilistic", dim=64, heads=4)
    y = attention(x)            # x, y: [batch, tokens, 64] float32

The forward solves the chosen energy attention (any block of stillpoint's
registry, stillpoint.energy_blocks()) to its fixed point in C++; the backward
is stillpoint's implicit gradient (the adjoint solve of the implicit function
theorem), wrapped in a torch.autograd.Function.
The module's parameters are torch.nn.Parameters over the C++ block's own
memory, so a torch optimizer's in-place update is what the next forward uses.
"""
import json

import torch

from stillpoint import _stillpoint as _core

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def _yaml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a double-quoted YAML scalar
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    raise TypeError(f"option value {value!r}: expected a bool, number, string or list, "
                    f"got {type(value).__name__}")


def _overrides(prefix, options):
    """{"forward": {"max_iterations": 8}} -> ["<prefix>forward.max_iterations=8"]."""
    out = []
    for key, value in options.items():
        if isinstance(value, dict):
            out += _overrides(f"{prefix}{key}.", value)
        else:
            out.append(f"{prefix}{key}={_yaml_value(value)}")
    return out


class _EnergyAttentionFunction(torch.autograd.Function):
    """y = attention(x); backward: stillpoint's implicit gradient for x and the parameters."""

    @staticmethod
    def forward(ctx, core, x, *parameters):
        keep_graph = any(ctx.needs_input_grad[1:])
        y, graph = core.forward(x.detach().contiguous().numpy(), keep_graph)
        # The C++ graph lives as long as torch's (so gradcheck and
        # retain_graph=True can run backward through it more than once).
        ctx.graph = graph
        return torch.from_numpy(y)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        grad_x, grad_parameters = ctx.graph.backward(grad_y.detach().contiguous().numpy())
        needs = ctx.needs_input_grad
        grads = [None, torch.from_numpy(grad_x) if needs[1] else None]
        for need, grad in zip(needs[2:], grad_parameters):
            grads.append(torch.from_numpy(grad) if need and grad is not None else None)
        return tuple(grads)


class EnergyAttention(torch.nn.Module):
    """An energy attention of stillpoint as a torch.nn.Module.

    kind: the block (one of stillpoint.energy_blocks(), the registered
    ones); dim: token width; heads: attention heads (dim must be a
    multiple); dtype: torch.float32 or torch.float64; seed: of the
    parameters' initialisation; causal: autoregressive masking.
    **options: the block's keys as in YAML under model.energy (beta,
    value_precision, normalize_input, measure, components, memories, step,
    key_adaptation={"iterations": 2}, ...), and solver= the inner solve as
    under model.attention_solver ({"forward": {"type": "anderson",
    "max_iterations": 16, "relative_tolerance": 1e-4}, "backward": {...}}).
    An unknown key or a bad value raises ValueError with the config's message.

    forward(x): x [batch, tokens, dim] of the module's dtype, on the CPU ->
    the attention's output [batch, tokens, dim], without the skip connection
    (as torch.nn.MultiheadAttention's output; add x yourself).
    """

    def __init__(self, kind, dim, heads, *, dtype=torch.float32, seed=0, causal=False,
                 **options):
        super().__init__()
        if dtype not in _DTYPES:
            raise TypeError(f"dtype: expected torch.float32 or torch.float64, got {dtype}")
        solver = options.pop("solver", {})
        if not isinstance(solver, dict):
            raise TypeError(f"solver: expected a dict of model.attention_solver keys, got "
                            f"{type(solver).__name__}")
        overrides = (_overrides("model.energy.", options) +
                     _overrides("model.attention_solver.", solver))
        self.kind, self.dim, self.heads, self.dtype = kind, dim, heads, dtype
        self._core = _core._EnergyAttention(kind, dim, heads, _DTYPES[dtype], overrides, seed,
                                            causal)
        # (stillpoint's dotted name, attribute name, address of the shared memory)
        self._shared = []
        for name, array, requires_grad in self._core.parameters():
            parameter = torch.nn.Parameter(torch.from_numpy(array), requires_grad=requires_grad)
            attribute = name.replace(".", "_")
            self.register_parameter(attribute, parameter)
            self._shared.append((name, attribute, parameter.data_ptr()))

    def stillpoint_names(self):
        """Attribute name -> the parameter's dotted name in stillpoint (block.wq.weight, ...)."""
        return {attribute: name for name, attribute, _ in self._shared}

    def _parameters_in_order(self):
        parameters = []
        for name, attribute, address in self._shared:
            parameter = getattr(self, attribute)
            if parameter.data_ptr() != address or parameter.dtype != self.dtype:
                raise RuntimeError(
                    f"EnergyAttention: parameter {attribute} ({name}) no longer shares memory "
                    "with the stillpoint block (replaced, e.g. by .to(), .double() or "
                    "assigning .data); build the module with the dtype you need instead")
            parameters.append(parameter)
        return parameters

    def forward(self, x):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor [batch, tokens, {self.dim}], "
                            f"got {type(x).__name__}")
        if x.device.type != "cpu":
            raise TypeError(f"x: expected a CPU tensor, got one on {x.device}")
        parameters = self._parameters_in_order()
        if x.dtype != self.dtype:
            raise TypeError(f"x: expected dtype {self.dtype} (the module's), got {x.dtype}")
        return _EnergyAttentionFunction.apply(self._core, x, *parameters)

    def solver_report(self):
        """The last inner solve's one-line summary, and its adjoint's (after a backward)."""
        return self._core.forward_report(), self._core.backward_report()

    def extra_repr(self):
        return f"{self._core.name}, dim={self.dim}, heads={self.heads}, dtype={self.dtype}"
