// Associative memory with the modern Hopfield energy: store images of
// handwritten digits, show the network each image with a quarter of its
// pixels blanked, and let it settle at the fixed point of
// xi <- X softmax(beta X^T xi). At small beta the fixed points are averages
// of many patterns (metastable states); as beta grows each query falls into
// the basin of one stored image.
//
//   build/bin/hopfield_retrieval [OUT_DIR] [NUM_PATTERNS]
//
// Writes OUT_DIR/patterns.csv and OUT_DIR/queries.csv (default OUT_DIR:
// runs/hopfield_retrieval), so the same problem can be solved from the
// command line:
//
//   build/bin/stillpoint retrieve --patterns OUT_DIR/patterns.csv
//       --queries OUT_DIR/queries.csv --beta 128 --out OUT_DIR/beta128
//
// Exits non-zero unless at least 95% of the queries retrieve their own image
// at the largest beta and fewer than half do at the smallest (the effect the
// example is about). Retrieval is not exact at every beta: a blanked image
// can lie closer to another stored image of the same digit.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "framework/random.h"
#include "training/retrieve.h"

#ifndef STILLPOINT_DATA_DIR
#define STILLPOINT_DATA_DIR "examples/data"
#endif

using namespace stillpoint;

int main(int argc, char** argv) {
  const std::string out_dir = argc > 1 ? argv[1] : "runs/hopfield_retrieval";
  const int64_t count = argc > 2 ? std::atoll(argv[2]) : 200;
  const char* data_dir = std::getenv("STILLPOINT_DATA_DIR");
  const std::string digits =
      std::string(data_dir && *data_dir ? data_dir : STILLPOINT_DATA_DIR) + "/digits.csv.gz";

  // Stored patterns: the first `count` images, centred and scaled to unit
  // length (64 pixels each; the label column is dropped).
  const Tensor images = ReadCsvMatrix(digits, DType::kFloat64);  // [N, 64 pixels + label]
  if (images.dim(1) != 65 || count < 1 || count > images.dim(0)) {
    std::fprintf(stderr, "%s: expected at least %lld rows of 64 pixels and a label\n",
                 digits.c_str(), static_cast<long long>(count));
    return 2;
  }
  Tensor patterns = Tensor::Zeros(Shape{count, 64}, DType::kFloat64);
  for (int64_t i = 0; i < count; ++i) {
    const double* pixels = images.data<double>() + i * 65;
    double* row = patterns.data<double>() + i * 64;
    double mean = 0, norm = 0;
    for (int j = 0; j < 64; ++j) mean += pixels[j] / 64;
    for (int j = 0; j < 64; ++j) {
      row[j] = pixels[j] - mean;
      norm += row[j] * row[j];
    }
    for (int j = 0; j < 64; ++j) row[j] /= std::sqrt(norm);
  }
  // Queries: every pattern with 16 of its 64 pixels set to zero.
  Tensor queries = patterns.Clone();
  Rng rng(7);
  for (int64_t i = 0; i < count; ++i) {
    for (int blanked = 0; blanked < 16;) {
      double& pixel = queries.data<double>()[i * 64 + rng.UniformInt(64)];
      if (pixel != 0.0) pixel = 0.0, ++blanked;
    }
  }
  std::filesystem::create_directories(out_dir);
  WriteCsvMatrix(out_dir + "/patterns.csv", patterns);
  WriteCsvMatrix(out_dir + "/queries.csv", queries);

  std::printf("%lld stored digit images, queries with 25%% of the pixels blanked\n\n",
              static_cast<long long>(count));
  std::printf("| beta | retrieved own pattern | mean iterations | converged |\n|---|---|---|---|\n");
  std::vector<double> accuracy;
  const std::vector<double> betas = {1, 8, 32, 128, 512};
  for (double beta : betas) {
    ForwardSolverOptions options = RetrievalSolverOptions();
    options.max_iterations = 100;
    const RetrievalResult r = RetrieveHopfield(patterns, queries, beta, options);
    int64_t own = 0, converged = 0;
    double iterations = 0;
    for (int64_t i = 0; i < count; ++i) {
      own += r.nearest[i] == i;
      converged += r.summary.sample_termination[i] == TerminationType::kConverged;
      iterations += r.summary.sample_iterations[i];
    }
    accuracy.push_back(static_cast<double>(own) / count);
    std::printf("| %g | %.1f%% | %.1f | %lld/%lld |\n", beta, 100.0 * accuracy.back(),
                iterations / count, static_cast<long long>(converged),
                static_cast<long long>(count));
  }
  std::printf("\nCSV files for `stillpoint retrieve`: %s/patterns.csv, %s/queries.csv\n",
              out_dir.c_str(), out_dir.c_str());
  return accuracy.back() >= 0.95 && accuracy.front() < 0.5 ? 0 : 1;
}
