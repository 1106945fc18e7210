#include "training/retrieve.h"

#include <algorithm>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "framework/ops_hopfield.h"
#include "framework/serialize.h"
#include "solvers/fixed_point_solver.h"
#include "training/data/dataset.h"
#include "training/metrics.h"

namespace stillpoint {

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
    HopfieldUpdateInto(patterns, beta, z, out);
    return true;
  };
  RetrievalResult result;
  result.fixed_points = queries.Clone();
  FixedPointSolver::Create(options)->Solve(problem, &result.fixed_points, &result.summary);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void DiagnoseHopfield(const Tensor& patterns, double beta, RetrievalResult* result) {
  HopfieldNearestAndEnergy(patterns, beta, result->fixed_points, &result->nearest,
                           &result->energy);
}

RetrievalResult RetrieveHopfield(const Tensor& patterns,
                                 const Tensor& queries,
                                 double beta,
                                 const ForwardSolverOptions& options) {
  RetrievalResult result = SolveHopfield(patterns, queries, beta, options);
  DiagnoseHopfield(patterns, beta, &result);
  return result;
}

Tensor ReadCsvMatrix(const std::string& path, DType dtype, const ReadLimit& limit) {
  const std::string text = ReadFileMaybeGzip(path, limit);
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
