// An energy attention block (layers/energy_attention.h) for
// stillpoint.torch.EnergyAttention: built from the same option keys as a
// YAML config (model.energy.* and model.attention_solver.*, validated by the
// config schema), its parameters exposed as ndarrays over the block's own
// storage, and a forward that keeps its graph for one implicit backward.
#include "layers/energy_attention.h"

#include <pybind11/stl.h>

#include "framework/autograd.h"
#include "python/src/py_bindings.h"
#include "training/config_schema.h"

namespace stillpoint::python {
namespace {

// The options an EnergyAttention is built with: a config of the model
// keys (model.attention = kind, model.dim, model.heads, dtype) plus the
// caller's overrides, read by the trainer's own conversions, so a key means
// what it means in YAML and a wrong one fails with the schema's message.
EnergyAttentionOptions OptionsFromOverrides(const std::string& kind,
                                            int64_t dim,
                                            int64_t heads,
                                            const std::string& dtype,
                                            const std::vector<std::string>& overrides,
                                            bool causal) {
  std::vector<std::string> all = {"model.attention=" + kind, "model.dim=" + std::to_string(dim),
                                  "model.heads=" + std::to_string(heads), "dtype=" + dtype};
  all.insert(all.end(), overrides.begin(), overrides.end());
  const Config config =
      Config::FromYaml(StillpointSchema(), "", "stillpoint.torch.EnergyAttention", all);
  const ModelOptions model = ModelOptionsFromConfig(config);
  EnergyAttentionOptions options;
  options.block = model.cell_options.energy;
  options.block.layer = kind;
  options.block.causal = causal;
  options.solver = *model.cell_options.attention_solver;
  return options;
}

// One forward's graph, kept as long as torch keeps the forward's node (each
// backward retains it: gradcheck and retain_graph=True run several).
class AttentionGraph {
 public:
  // summary: the inner solve's adjoint summary of this forward (filled by
  // the backward); report: where the core keeps the last backward's line.
  AttentionGraph(Var input, Var output, VarList parameters,
                 std::shared_ptr<const AdjointSummary> summary,
                 std::shared_ptr<std::string> report)
      : input_(std::move(input)),
        output_(std::move(output)),
        parameters_(std::move(parameters)),
        summary_(std::move(summary)),
        report_(std::move(report)) {}

  // dL/dx and dL/dparameter (None where a parameter is frozen) for dL/dy =
  // grad_output.
  py::tuple Backward(const py::handle& grad_output_array) {
    const DType dtype = output_.dtype();
    std::vector<int64_t> dims = output_.shape().dims();
    std::string text = "[" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + ", " +
                       std::to_string(dims[2]) + "] (the forward's output)";
    const Tensor grad_output =
        TensorFromArray(grad_output_array, "grad_output", {dims, text}, &dtype);
    VarList inputs = {input_};
    inputs.insert(inputs.end(), parameters_.begin(), parameters_.end());
    VarList grads;
    {
      py::gil_scoped_release release;
      grads = grad({output_}, inputs, {Var(grad_output.Clone())}, {.retain_graph = true});
    }
    // The report describes this backward, whatever forwards ran since.
    if (summary_ && report_) *report_ = summary_->BriefReport();
    py::list parameter_grads;
    for (std::size_t i = 1; i < grads.size(); ++i) {
      if (grads[i].defined()) {
        parameter_grads.append(ArrayFromTensor(grads[i].value()));
      } else if (parameters_[i - 1].requires_grad()) {
        parameter_grads.append(ArrayFromTensor(Tensor::Zeros(parameters_[i - 1].shape(), dtype)));
      } else {
        parameter_grads.append(py::none());
      }
    }
    py::object input_grad = grads[0].defined()
                                ? py::object(ArrayFromTensor(grads[0].value()))
                                : py::object(ArrayFromTensor(Tensor::Zeros(input_.shape(), dtype)));
    return py::make_tuple(input_grad, parameter_grads);
  }

 private:
  Var input_;
  Var output_;
  VarList parameters_;
  std::shared_ptr<const AdjointSummary> summary_;
  std::shared_ptr<std::string> report_;
};

class AttentionCore {
 public:
  AttentionCore(const std::string& kind,
                int64_t dim,
                int64_t heads,
                const std::string& dtype,
                const std::vector<std::string>& overrides,
                uint64_t seed,
                bool causal)
      : dim_(dim) {
    if (dim < 1)
      throw py::value_error("dim: expected a positive integer, got " + std::to_string(dim));
    if (heads < 1)
      throw py::value_error("heads: expected a positive integer, got " + std::to_string(heads));
    if (dim % heads != 0) {
      throw py::value_error("dim (" + std::to_string(dim) + ") must be a multiple of heads (" +
                            std::to_string(heads) + ")");
    }
    const EnergyAttentionOptions options =
        OptionsFromOverrides(kind, dim, heads, dtype, overrides, causal);
    Rng rng(seed);
    attention_ = std::make_shared<EnergyAttention>(options, rng);
    dtype_ = options.block.dtype;
  }

  // (dotted name, ndarray over the parameter's storage, requires_grad).
  py::list Parameters() const {
    py::list out;
    for (const auto& [name, var] : attention_->named_parameters()) {
      out.append(py::make_tuple(name, ArrayFromTensor(var.value()), var.requires_grad()));
    }
    return out;
  }

  // x [B, T, dim] -> (y [B, T, dim], graph or None). The output is a copy:
  // the graph's own tensor must not change under torch's in-place ops.
  py::tuple Forward(const py::handle& x_array, bool keep_graph) {
    const std::string text = "[B, T, " + std::to_string(dim_) + "]";
    const Tensor x = TensorFromArray(x_array, "x", {{-1, -1, dim_}, text}, &dtype_);
    if (x.dim(0) == 0 || x.dim(1) == 0) {
      throw py::value_error("x: expected at least one sequence of at least one token, got shape [" +
                            std::to_string(x.dim(0)) + ", " + std::to_string(x.dim(1)) + ", " +
                            std::to_string(dim_) + "]");
    }
    if (keep_graph) {
      Var input, output;
      {
        py::gil_scoped_release release;
        // A copy of x: torch may change its tensor in place after forward.
        input = Var(x.Clone(), /*requires_grad=*/true);
        const GradModeGuard record(true);
        output = attention_->Forward(input);
      }
      VarList parameters;
      for (const auto& [name, var] : attention_->named_parameters()) parameters.push_back(var);
      return py::make_tuple(
          ArrayFromTensor(output.value().Clone()),
          AttentionGraph(input, output, parameters, attention_->implicit().backward_summary(),
                         backward_report_));
    }
    Var output;
    {
      py::gil_scoped_release release;
      const NoGrad no_grad;
      output = attention_->Forward(Var(x));
    }
    return py::make_tuple(ArrayFromTensor(output.value().Clone()), py::none());
  }

  std::string ForwardReport() const {
    return attention_->implicit().forward_summary().BriefReport();
  }
  // The last backward's (empty before one ran).
  std::string BackwardReport() const { return *backward_report_; }
  std::string Name() const { return attention_->Name(); }
  const char* DTypeName() const { return NumpyDTypeName(dtype_); }

 private:
  int64_t dim_;
  DType dtype_ = DType::kFloat32;
  std::shared_ptr<EnergyAttention> attention_;
  std::shared_ptr<std::string> backward_report_ = std::make_shared<std::string>();
};

}  // namespace

void RegisterEnergyAttention(py::module_& m) {
  py::class_<AttentionGraph>(m, "_AttentionGraph")
      .def("backward", &AttentionGraph::Backward, py::arg("grad_output"));
  py::class_<AttentionCore>(m, "_EnergyAttention")
      .def(py::init<const std::string&, int64_t, int64_t, const std::string&,
                    const std::vector<std::string>&, uint64_t, bool>(),
           py::arg("kind"), py::arg("dim"), py::arg("heads"), py::arg("dtype"),
           py::arg("overrides"), py::arg("seed"), py::arg("causal"))
      .def("parameters", &AttentionCore::Parameters)
      .def("forward", &AttentionCore::Forward, py::arg("x"), py::arg("keep_graph"))
      .def("forward_report", &AttentionCore::ForwardReport)
      .def("backward_report", &AttentionCore::BackwardReport)
      .def_property_readonly("name", &AttentionCore::Name)
      .def_property_readonly("dtype", &AttentionCore::DTypeName);
}

}  // namespace stillpoint::python
