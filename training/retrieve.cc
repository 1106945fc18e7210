#include "training/retrieve.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "framework/gemm.h"
#include "framework/parallel.h"
#include "framework/serialize.h"
#include "framework/vector_math.h"
#include "solvers/fixed_point_solver.h"
#include "training/dataset.h"
#include "training/metrics.h"

namespace stillpoint {
namespace {

template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Rows of z per parallel task: large enough that the patterns are packed for
// the GEMM a few times per evaluation, not once per 32 queries.
constexpr int64_t kRowsPerTask = 256;
// Queries per block of the float32 map: a block's [rows, N] scores stay in
// the core's cache between the two products.
constexpr int64_t kQueryBlock = 24;

// out = softmax(beta Z X^T) X for the rows of z; parallel over row blocks,
// each block one pair of GEMMs (the map is GEMM-bound).
template <typename T>
void HopfieldMap(const Tensor& patterns, double beta, const Tensor& z, Tensor* out) {
  const int64_t n = patterns.dim(0), d = patterns.dim(1), k = z.dim(0);
  const T* x = patterns.data<T>();
  ParallelFor(0, k, kRowsPerTask, [&](int64_t lo, int64_t hi) {
    const int64_t rows = hi - lo;
    RowMatrix<T> scores(rows, n);
    internal::Gemm<T>(false, true, rows, n, d, static_cast<T>(beta), z.data<T>() + lo * d, d, x, d,
                      scores.data(), n);
    for (int64_t r = 0; r < rows; ++r) {
      const T top = scores.row(r).maxCoeff();
      scores.row(r) = (scores.row(r).array() - top).exp();
      scores.row(r) /= scores.row(r).sum();
    }
    internal::Gemm<T>(false, false, rows, d, n, T(1), scores.data(), n, x, d,
                      out->data<T>() + lo * d, d);
  });
}

// The float32 map by blocks of queries: X^T and X packed once per task, then
// each block of queries goes from scores to output while its scores are in
// cache, and the [rows, d] output rows are normalised instead of the
// [rows, N] weights. The softmax runs in base 2, as the fused attention's:
// X^T is packed times beta log2(e), so the scores come out in base-2 units
// and 2^x (Exp2FlushPacket) replaces e^x.
template <>
void HopfieldMap<float>(const Tensor& patterns, double beta, const Tensor& z, Tensor* out) {
  const int64_t n = patterns.dim(0), d = patterns.dim(1), k = z.dim(0);
  const float* x = patterns.data<float>();
  ParallelFor(0, k, kRowsPerTask, [&](int64_t lo, int64_t hi) {
    thread_local internal::PackedFloatB patterns_t;  // X^T [d, N]
    thread_local internal::PackedFloatB patterns_n;  // X [N, d]
    thread_local std::vector<float> scores;
    patterns_t.Pack(true, d, n, x, d, static_cast<float>(beta * internal::kLog2e));
    patterns_n.Pack(false, n, d, x, d);
    scores.resize(kQueryBlock * n);
    float inverse_sum[kQueryBlock];
    for (int64_t i0 = lo; i0 < hi; i0 += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, hi - i0);
      patterns_t.Multiply(false, rows, 1.0f, z.data<float>() + i0 * d, d, scores.data(), n);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = scores.data() + r * n;
        const float top = internal::VecMax(row, n);
        inverse_sum[r] = 1.0f / internal::VecExp2Shifted(row, top, row, n);
      }
      float* o = out->data<float>() + i0 * d;
      patterns_n.Multiply(false, rows, 1.0f, scores.data(), n, o, d);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < d; ++j) o[r * d + j] *= inverse_sum[r];
      }
    }
  });
}

// Nearest pattern and energy of every fixed point, in float64: the dot
// products <x_j, xi_r> as one GEMM per block of fixed points.
template <typename T>
void Diagnose(const Tensor& patterns, double beta, RetrievalResult* result) {
  const int64_t n = patterns.dim(0), d = patterns.dim(1), q = result->fixed_points.dim(0);
  const RowMatrix<double> x =
      Eigen::Map<const RowMatrix<T>>(patterns.data<T>(), n, d).template cast<double>();
  result->nearest.assign(q, 0);
  result->energy.assign(q, 0.0);
  RowMatrix<double> dots;
  for (int64_t lo = 0; lo < q; lo += kRowsPerTask) {
    const int64_t rows = std::min(kRowsPerTask, q - lo);
    const RowMatrix<double> xi =
        Eigen::Map<const RowMatrix<T>>(result->fixed_points.data<T>() + lo * d, rows, d)
            .template cast<double>();
    dots.resize(rows, n);
    internal::Gemm<double>(false, true, rows, n, d, 1.0, xi.data(), d, x.data(), d, dots.data(), n);
    for (int64_t r = 0; r < rows; ++r) {
      Eigen::Index best = 0;
      const double top = dots.row(r).maxCoeff(&best);
      result->nearest[lo + r] = best;
      // (1/beta) lse(beta s), shifted by the maximum for stability.
      const double lse = top + std::log((beta * (dots.row(r).array() - top)).exp().sum()) / beta;
      result->energy[lo + r] = 0.5 * xi.row(r).squaredNorm() - lse;
    }
  }
}

}  // namespace

ForwardSolverOptions RetrievalSolverOptions() {
  ForwardSolverOptions options;
  options.type = ForwardSolverType::kPicard;
  options.max_iterations = 32;
  options.stop_mode = StopMode::kRelative;
  options.relative_tolerance = 1e-6;
  return options;
}

RetrievalResult SolveHopfield(const Tensor& patterns,
                              const Tensor& queries,
                              double beta,
                              const ForwardSolverOptions& options) {
  SP_CHECK(patterns.rank() == 2 && queries.rank() == 2, "retrieve: patterns ", patterns.shape(),
           " and queries ", queries.shape(), " must be matrices");
  SP_CHECK(patterns.dim(1) == queries.dim(1), "retrieve: patterns have dimension ", patterns.dim(1),
           " but queries have ", queries.dim(1));
  SP_CHECK(patterns.dtype() == queries.dtype(), "retrieve: patterns and queries differ in dtype");
  SP_CHECK(beta > 0 && std::isfinite(beta), "retrieve: beta must be positive, got ", beta);
  const auto start = std::chrono::steady_clock::now();
  FixedPointProblem problem;
  problem.batch_size = queries.dim(0);
  problem.state_size = queries.dim(1);
  problem.map = [&](const Tensor& z, const std::vector<int64_t>&, Tensor* out) {
    DispatchDType(z.dtype(),
                  [&](auto zero) { HopfieldMap<decltype(zero)>(patterns, beta, z, out); });
    return true;
  };
  RetrievalResult result;
  result.fixed_points = queries.Clone();
  FixedPointSolver::Create(options)->Solve(problem, &result.fixed_points, &result.summary);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void DiagnoseHopfield(const Tensor& patterns, double beta, RetrievalResult* result) {
  DispatchDType(patterns.dtype(),
                [&](auto zero) { Diagnose<decltype(zero)>(patterns, beta, result); });
}

RetrievalResult RetrieveHopfield(const Tensor& patterns,
                                 const Tensor& queries,
                                 double beta,
                                 const ForwardSolverOptions& options) {
  RetrievalResult result = SolveHopfield(patterns, queries, beta, options);
  DiagnoseHopfield(patterns, beta, &result);
  return result;
}

Tensor ReadCsvMatrix(const std::string& path, DType dtype) {
  const std::string text = ReadFileMaybeGzip(path);
  std::vector<double> values;
  int64_t columns = -1, rows = 0, line_number = 0;
  std::istringstream lines(text);
  std::string line;
  bool seen_line = false;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A header row of column names: its width is the rows' width.
    if (!seen_line && IsCsvHeader(line)) {
      seen_line = true;
      columns = static_cast<int64_t>(std::count(line.begin(), line.end(), ',')) + 1;
      continue;
    }
    seen_line = true;
    int64_t count = 0;
    // Cells split by hand: getline would drop an empty last cell ("1,2,").
    std::size_t begin = 0;
    while (true) {
      const std::size_t comma = line.find(',', begin);
      const std::string cell =
          line.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
      ++count;
      char* end = nullptr;
      const double value = std::strtod(cell.c_str(), &end);
      const bool rest_blank =
          end != cell.c_str() &&
          cell.find_first_not_of(" \t\r", end - cell.c_str()) == std::string::npos;
      SP_CHECK(rest_blank && std::isfinite(value), path, ":", line_number, ": column ", count,
               " is not a finite number: '", cell, "'");
      SP_CHECK(dtype != DType::kFloat32 || std::fabs(value) <= FLT_MAX, path, ":", line_number,
               ": column ", count, " ('", cell, "') does not fit in float32 (--dtype float64 "
               "holds it)");
      values.push_back(value);
      if (comma == std::string::npos) break;
      begin = comma + 1;
    }
    SP_CHECK(columns < 0 || count == columns, path, ":", line_number, ": ", count,
             " columns, but earlier rows (or the header row) have ", columns);
    columns = count;
    ++rows;
  }
  SP_CHECK(rows > 0, path, ": no rows");
  return Tensor::FromVector(Shape{rows, columns}, values, dtype);
}

void WriteCsvMatrix(const std::string& path, const Tensor& matrix) {
  std::ostringstream out;
  out.precision(9);
  for (int64_t r = 0; r < matrix.dim(0); ++r) {
    for (int64_t c = 0; c < matrix.dim(1); ++c) {
      out << (c ? "," : "") << matrix.at(r * matrix.dim(1) + c);
    }
    out << "\n";
  }
  WriteFileAtomically(path, out.str());
}

void WriteRetrieval(const std::string& directory, const RetrievalResult& result, double beta) {
  std::filesystem::create_directories(directory);
  WriteCsvMatrix((std::filesystem::path(directory) / "fixed_points.csv").string(),
                 result.fixed_points);
  const SolverSummary& s = result.summary;
  std::ostringstream json;
  json << "{\n  \"beta\": " << JsonNumber(beta)
       << ",\n  \"queries\": " << result.fixed_points.dim(0)
       << ",\n  \"solver\": " << JsonString(ToString(s.solver_type))
       << ",\n  \"termination\": " << JsonString(ToString(s.termination_type))
       << ",\n  \"converged\": " << s.CountSamples(TerminationType::kConverged)
       << ",\n  \"function_evaluations\": " << s.function_evaluations
       << ",\n  \"seconds\": " << JsonNumber(result.seconds) << ",\n  \"per_query\": [\n";
  for (std::size_t q = 0; q < result.nearest.size(); ++q) {
    json << "    {\"iterations\": " << s.sample_iterations[q]
         << ", \"residual\": " << JsonNumber(s.sample_rel_residual[q])
         << ", \"status\": " << JsonString(ToString(s.sample_termination[q]))
         << ", \"nearest\": " << result.nearest[q]
         << ", \"energy\": " << JsonNumber(result.energy[q]) << "}"
         << (q + 1 < result.nearest.size() ? "," : "") << "\n";
  }
  json << "  ]\n}\n";
  WriteFileAtomically((std::filesystem::path(directory) / "stats.json").string(), json.str());
}

}  // namespace stillpoint
