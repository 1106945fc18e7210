// Hopfield retrieval (`stillpoint retrieve`, and bench/SPEC.md W3): for each
// query xi_0, the fixed point of the modern Hopfield update
//
//   xi <- X softmax(beta X^T xi)
//
// over the stored patterns X (one pattern per row of `patterns`), which is a
// CCCP descent of the energy E(xi) = 1/2 |xi|^2 - (1/beta) lse(beta X^T xi).
// Queries are solved as one batch with per-query convergence (a query that
// has converged is no longer evaluated).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/serialize.h"
#include "framework/tensor.h"
#include "solvers/forward_options.h"
#include "solvers/solver_summary.h"

namespace stillpoint {

struct RetrievalResult {
  Tensor fixed_points;           // [Q, d]
  std::vector<int64_t> nearest;  // per query: argmax_j <x_j, xi*>
  std::vector<double> energy;    // per query: E(xi*)
  SolverSummary summary;
  double seconds = 0;  // the solve's wall time (not the diagnostics)
};

// patterns [N, d], queries [Q, d] (same dtype). The default solver options
// for retrieval are RetrievalSolverOptions(). SolveHopfield then
// DiagnoseHopfield.
RetrievalResult RetrieveHopfield(const Tensor& patterns,
                                 const Tensor& queries,
                                 double beta,
                                 const ForwardSolverOptions& options);
// The solve alone: fixed_points, summary and seconds (nearest and energy
// left empty).
RetrievalResult SolveHopfield(const Tensor& patterns,
                              const Tensor& queries,
                              double beta,
                              const ForwardSolverOptions& options);
// Fills result->nearest and result->energy from result->fixed_points, in
// float64.
void DiagnoseHopfield(const Tensor& patterns, double beta, RetrievalResult* result);

// Picard iteration to a relative residual of 1e-6 within 32 iterations (W3).
ForwardSolverOptions RetrievalSolverOptions();

// A numeric CSV (one row per line, comma separated, no header) as an [rows,
// cols] tensor. Empty, ragged or non-numeric input is an Error naming the
// file and line; a file beyond `limit` (decompressed) is an Error naming it.
Tensor ReadCsvMatrix(const std::string& path, DType dtype, const ReadLimit& limit = ReadLimit());
void WriteCsvMatrix(const std::string& path, const Tensor& matrix);

// Writes DIR/fixed_points.csv and DIR/stats.json (per query: iterations,
// residual, status, nearest pattern, energy; totals and timing).
void WriteRetrieval(const std::string& directory, const RetrievalResult& result, double beta);

}  // namespace stillpoint
