// stillpoint.retrieve: Hopfield retrieval (training/retrieve.h), the solve
// behind `stillpoint retrieve`, on ndarrays instead of CSV files.
#include "training/retrieve.h"

#include <pybind11/stl.h>

#include <cfloat>
#include <climits>
#include <cmath>

#include "python/src/py_bindings.h"
#include "solvers/forward_options.h"

namespace stillpoint::python {
namespace {

std::string SolverNames() {
  std::string names;
  for (ForwardSolverType type : AllForwardSolverTypes()) {
    names += (names.empty() ? "" : ", ") + std::string(ToString(type));
  }
  return names;
}

py::dict Retrieve(const py::handle& patterns_array,
                  const py::handle& queries_array,
                  double beta,
                  const std::string& solver,
                  double tol,
                  int64_t max_iter) {
  const Tensor patterns = TensorFromArray(patterns_array, "patterns", {{-1, -1}, "[N, d]"});
  const int64_t d = patterns.dim(1);
  const DType dtype = patterns.dtype();
  const Tensor queries =
      TensorFromArray(queries_array, "queries",
                      {{-1, d}, "[Q, " + std::to_string(d) + "] (d = patterns.shape[1])"}, &dtype);
  if (patterns.numel() == 0)
    throw py::value_error("patterns: expected at least one pattern of width >= 1");
  if (queries.dim(0) == 0) throw py::value_error("queries: expected at least one query");
  if (HasNonFinite(patterns)) throw py::value_error("patterns: holds NaN or infinity");
  if (HasNonFinite(queries)) throw py::value_error("queries: holds NaN or infinity");
  if (!std::isfinite(beta) || beta <= 0) {
    throw py::value_error("beta: expected a positive finite number, got " + std::to_string(beta));
  }
  if (dtype == DType::kFloat32 && beta > FLT_MAX) {
    throw py::value_error("beta: does not fit in float32 (pass float64 arrays)");
  }
  ForwardSolverOptions options = RetrievalSolverOptions();
  if (!StringToForwardSolverType(solver, &options.type)) {
    throw py::value_error("solver: unknown solver '" + solver + "' (known: " + SolverNames() + ")");
  }
  if (!(tol >= 0)) throw py::value_error("tol: expected a number >= 0, got " + std::to_string(tol));
  if (max_iter < 1 || max_iter > INT_MAX) {
    throw py::value_error("max_iter: expected an integer in [1, " + std::to_string(INT_MAX) +
                          "], got " + std::to_string(max_iter));
  }
  options.relative_tolerance = tol;
  options.max_iterations = static_cast<int>(max_iter);
  std::string error;
  if (!options.IsValid(&error)) throw py::value_error("solver options: " + error);

  RetrievalResult result;
  {
    py::gil_scoped_release release;
    result = RetrieveHopfield(patterns, queries, beta, options);
  }
  const SolverSummary& s = result.summary;
  const py::ssize_t q = queries.dim(0);
  py::array_t<int64_t> iterations(q), nearest(q);
  py::array_t<double> residuals(q), energy(q);
  py::array_t<bool> converged(q);
  py::list status;
  for (py::ssize_t i = 0; i < q; ++i) {
    iterations.mutable_at(i) = s.sample_iterations[i];
    residuals.mutable_at(i) = s.sample_rel_residual[i];
    converged.mutable_at(i) = s.sample_termination[i] == TerminationType::kConverged;
    status.append(ToString(s.sample_termination[i]));
    nearest.mutable_at(i) = result.nearest[i];
    energy.mutable_at(i) = result.energy[i];
  }
  py::dict out;
  out["fixed_points"] = ArrayFromTensor(result.fixed_points);
  out["iterations"] = iterations;
  out["residuals"] = residuals;
  out["converged"] = converged;
  out["status"] = status;
  out["nearest"] = nearest;
  out["energy"] = energy;
  out["seconds"] = result.seconds;
  out["report"] = s.BriefReport();
  return out;
}

}  // namespace

void RegisterRetrieve(py::module_& m) {
  m.def("retrieve", &Retrieve, py::arg("patterns"), py::arg("queries"), py::arg("beta"),
        py::arg("solver") = "picard", py::arg("tol") = 1e-6, py::arg("max_iter") = 32,
        R"doc(
Hopfield retrieval, as `stillpoint retrieve`: for each query xi_0 (a row of
queries), the fixed point of xi <- X^T softmax(beta X xi) over the stored
patterns X (one per row of patterns), solved as one batch with per-query
convergence to a relative residual of tol within max_iter iterations.

patterns: float32 or float64 ndarray [N, d]; queries: [Q, d] of the same dtype
(both C-contiguous; read without a copy). Returns a dict: fixed_points [Q, d]
(the arrays' dtype), iterations, residuals (relative), converged, status
(per query), nearest (argmax_j <x_j, xi*>), energy (E(xi*)), seconds (the
solve's wall time) and report (the solver's one-line summary).)doc");
}

}  // namespace stillpoint::python
