#include "training/demos/hidden_state_demo.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <ostream>
#include <vector>

#include "framework/check.h"
#include "framework/ops.h"
#include "framework/random.h"
#include "layers/energy_layer.h"
#include "solvers/regularizers.h"
#include "training/demos/demo_output.h"
#include "training/demos/trained_run.h"
#include "training/svg_plot.h"

namespace stillpoint {
namespace {

// The hidden states of one iteration as rows (one per token).
Eigen::MatrixXd Rows(const Tensor& states, int64_t width) {
  const std::vector<double> v = states.ToVector();
  const int64_t rows = static_cast<int64_t>(v.size()) / width;
  Eigen::MatrixXd m(rows, width);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) m(r, c) = v[r * width + c];
  return m;
}

// Per iteration: the mean state's norm and the covariance eigenvalues
// (descending), with the top eigenvector of the last iteration.
struct Distribution {
  std::vector<double> mean_norm;
  std::vector<std::vector<double>> mean;         // [iteration][k]
  std::vector<std::vector<double>> eigenvalues;  // [iteration][k]
  Eigen::VectorXd top_eigenvector;
};

Distribution Describe(const std::vector<Eigen::MatrixXd>& iterates) {
  Distribution d;
  for (const Eigen::MatrixXd& x : iterates) {
    const Eigen::RowVectorXd mean = x.colwise().mean();
    const Eigen::MatrixXd centred = x.rowwise() - mean;
    const Eigen::MatrixXd cov = centred.transpose() * centred / static_cast<double>(x.rows());
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(cov);
    std::vector<double> values(eig.eigenvalues().data(),
                               eig.eigenvalues().data() + eig.eigenvalues().size());
    std::reverse(values.begin(), values.end());
    d.mean_norm.push_back(mean.norm());
    d.mean.emplace_back(mean.data(), mean.data() + mean.size());
    d.eigenvalues.push_back(values);
    d.top_eigenvector = eig.eigenvectors().col(eig.eigenvectors().cols() - 1);
  }
  return d;
}

double Median(std::vector<double> v) {
  SP_CHECK(!v.empty(), "Median of nothing");
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

struct Measured {
  std::vector<Eigen::MatrixXd> iterates;
  std::vector<double> residual;   // |z_{t} - z_{t-1}| / |z_t|, 0 at t = 0
  std::vector<double> alignment;  // mean |cos| to the reference direction
  std::vector<double> tangent;    // median tan of the angle to it
  double rate_measured = 0.0, rate_predicted = 0.0;
  double lambda1 = 0.0, lambda2 = 0.0, jacobian_radius = 0.0;
};

// Iterates f from z0 (tape off), keeping every state as rows of `width`.
std::vector<Tensor> Iterate(const CellFn& f, const Tensor& z0, int64_t iterations) {
  NoGrad no_grad;
  std::vector<int64_t> ids(z0.dim(0));
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<Tensor> states = {z0};
  for (int64_t t = 0; t < iterations; ++t) {
    states.push_back(f(Var(states.back()), ids).value().Clone());
  }
  return states;
}

std::vector<double> RelativeResiduals(const std::vector<Tensor>& states) {
  std::vector<double> r = {0.0};
  for (std::size_t t = 1; t < states.size(); ++t) {
    const std::vector<double> a = states[t].ToVector(), b = states[t - 1].ToVector();
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff += (a[i] - b[i]) * (a[i] - b[i]);
      norm += a[i] * a[i];
    }
    r.push_back(std::sqrt(diff) / std::max(std::sqrt(norm), 1e-300));
  }
  return r;
}

// Alignment (mean |cos|) and median tan of every iterate's rows to `dir`.
void Align(Measured* m, const Eigen::VectorXd& dir) {
  const Eigen::VectorXd unit = dir.normalized();
  for (const Eigen::MatrixXd& x : m->iterates) {
    std::vector<double> tangents;
    double cos_sum = 0.0;
    for (Eigen::Index r = 0; r < x.rows(); ++r) {
      const double along = x.row(r).dot(unit);
      const double across = (x.row(r).transpose() - along * unit).norm();
      cos_sum += std::abs(along) / std::max(x.row(r).norm(), 1e-300);
      tangents.push_back(across / std::max(std::abs(along), 1e-300));
    }
    m->alignment.push_back(cos_sum / static_cast<double>(x.rows()));
    m->tangent.push_back(Median(tangents));
  }
}

// ---------------------------------------------------------------- S7b model

Measured RunLayerNormEquilibrium(const HiddenStateDemoOptions& o) {
  const int64_t D = o.dim;
  Rng rng(o.seed);
  Eigen::MatrixXd gaussian(D, D);
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j) gaussian(i, j) = rng.Normal();
  const Eigen::MatrixXd q = Eigen::HouseholderQR<Eigen::MatrixXd>(gaussian).householderQ();
  // Sigma = Q diag(s) Q', s_i = 3 * 0.65^i: a clear gap between the top two
  // eigenvalues of M and the rest, so the asymptotic rate shows early.
  Eigen::VectorXd s(D);
  for (int64_t i = 0; i < D; ++i) s(i) = 3.0 * std::pow(0.65, static_cast<double>(i));
  const Eigen::MatrixXd expansion =
      Eigen::MatrixXd::Identity(D, D) + q * s.asDiagonal() * q.transpose();
  const Eigen::MatrixXd centring =
      Eigen::MatrixXd::Identity(D, D) - Eigen::MatrixXd::Constant(D, D, 1.0 / D);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(centring * expansion * centring);

  Measured m;
  m.lambda1 = eig.eigenvalues()(D - 1);
  m.lambda2 = eig.eigenvalues()(D - 2);
  m.rate_predicted = m.lambda2 / m.lambda1;

  std::vector<double> flat;
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j) flat.push_back(expansion(i, j));
  const Var expand(Tensor::FromVector(Shape{D, D}, flat, DType::kFloat64));  // symmetric
  const CellFn f = [expand](const Var& z, const std::vector<int64_t>&) {
    return layer_norm(matmul(z, expand), Var(), Var(), /*eps=*/0.0);
  };
  const Tensor z0 = RandomNormal(Shape{o.tokens, D}, 0.0, 1.0, DType::kFloat64, rng);
  const std::vector<Tensor> states = Iterate(f, z0, o.iterations);
  for (const Tensor& t : states) m.iterates.push_back(Rows(t, D));
  m.residual = RelativeResiduals(states);
  Align(&m, eig.eigenvectors().col(D - 1));

  // Per token: the factor by which tan shrinks per iteration after burn-in.
  const Eigen::VectorXd v1 = eig.eigenvectors().col(D - 1);
  std::vector<double> rates;
  const Eigen::MatrixXd& first = m.iterates[o.burn_in];
  const Eigen::MatrixXd& last = m.iterates.back();
  auto tan_of = [&](const Eigen::MatrixXd& x, Eigen::Index r) {
    const double along = x.row(r).dot(v1);
    return (x.row(r).transpose() - along * v1).norm() / std::abs(along);
  };
  const double span = static_cast<double>(o.iterations - o.burn_in);
  for (Eigen::Index r = 0; r < last.rows(); ++r) {
    rates.push_back(std::pow(tan_of(last, r) / tan_of(first, r), 1.0 / span));
  }
  m.rate_measured = Median(rates);
  m.jacobian_radius = EstimateSpectralRadius(f, states.back()).max_radius;
  return m;
}

// ------------------------------------------------------------- a trained run

Measured RunTrainedModel(const HiddenStateDemoOptions& o) {
  Experiment experiment = LoadTrainedRun(o.run);
  SequenceModel& model = *experiment.model;
  if (model.implicit() == nullptr) {
    throw ConfigError("run '" + o.run + "': its model (model.kind " +
                      ToString(model.options().kind) +
                      ") has no implicit layer; the hidden-state demo needs model.kind implicit "
                      "or energy");
  }
  const Batch batch = FirstTestExamples(experiment, o.examples);
  NoGrad no_grad;
  const Var u = batch.features.defined()
                    ? model.EmbedFeatures(Var(batch.features))
                    : model.Embed(batch.tokens, Shape{batch.batch_size, batch.length});

  CellFn f;
  Tensor z0;
  EnergyBlockProblemPtr problem;
  if (model.options().kind == ModelKind::kEnergy) {
    problem = model.energy_block()->Prepare(u);
    z0 = problem->initial_state.value().Clone();
    std::vector<int64_t> dims;
    for (int i = 1; i < z0.rank(); ++i) dims.push_back(z0.dim(i));
    f = MakeUpdateCell(problem->energy, Shape(dims));
  } else {
    std::shared_ptr<Cell> cell = model.cell(0);
    const Var injection = u;
    f = [cell, injection](const Var& z, const std::vector<int64_t>& ids) {
      return cell->Forward(z, gather(injection, 0, ids), ids);
    };
    z0 = Tensor::Zeros(u.shape(), u.dtype());
  }
  const std::vector<Tensor> states = Iterate(f, z0, o.iterations);

  Measured m;
  for (const Tensor& t : states) {
    Tensor tokens = t;
    if (t.rank() == 4) {  // [B, H, T, dv] -> [B, T, H dv]
      tokens = permute(Var(t), {0, 2, 1, 3}).value().Clone();
    }
    m.iterates.push_back(Rows(tokens, tokens.dim(-1) * (t.rank() == 4 ? t.dim(1) : 1)));
  }
  m.residual = RelativeResiduals(states);
  // Per sample: the geometric mean of its successive residual ratios.
  const int64_t samples = z0.dim(0);
  std::vector<double> rates;
  for (int64_t b = 0; b < samples; ++b) {
    std::vector<Tensor> rows;
    for (const Tensor& t : states) rows.push_back(t.SliceRows(b, b + 1));
    const std::vector<double> r = RelativeResiduals(rows);
    double log_sum = 0.0;
    int count = 0;
    for (std::size_t t = static_cast<std::size_t>(o.burn_in) + 1; t < r.size(); ++t) {
      if (r[t - 1] > 1e-5 && r[t] > 1e-5) {
        log_sum += std::log(r[t] / r[t - 1]);
        ++count;
      }
    }
    if (count > 0) rates.push_back(std::exp(log_sum / count));
  }
  SP_CHECK(!rates.empty(), "run '", o.run, "': every sample converged to the float32 floor "
           "before iteration ", o.burn_in, "; lower --burn-in");
  m.rate_measured = Median(rates);
  m.rate_predicted = Median(EstimateSpectralRadius(f, states.back()).radius);
  Align(&m, Describe({m.iterates.back()}).top_eigenvector);
  return m;
}

}  // namespace

void CheckHiddenStateDemoOptions(const HiddenStateDemoOptions& o) {
  SP_CHECK(!o.out_dir.empty(), "--out must name a directory");
  SP_CHECK(o.dim >= 3 && o.dim <= 256, "--dim must be in [3, 256], got ", o.dim);
  SP_CHECK(o.tokens >= 2 * o.dim && o.tokens <= 1000000, "--tokens must be in [2 dim, 10^6], got ",
           o.tokens);
  SP_CHECK(o.burn_in >= 0, "--burn-in must be >= 0, got ", o.burn_in);
  SP_CHECK(o.iterations >= o.burn_in + 5 && o.iterations <= 10000,
           "--iterations must be at least --burn-in + 5 (and at most 10000), got ", o.iterations);
  SP_CHECK(o.examples >= 1 && o.examples <= 4096, "--examples must be in [1, 4096], got ",
           o.examples);
}

HiddenStateDemoResult RunHiddenStateDemo(const HiddenStateDemoOptions& o, std::ostream& out) {
  CheckHiddenStateDemoOptions(o);
  const Measured m = o.run.empty() ? RunLayerNormEquilibrium(o) : RunTrainedModel(o);
  PrepareDemoDirectory(o.out_dir, o.overwrite);
  const Distribution d = Describe(m.iterates);
  const std::filesystem::path dir(o.out_dir);

  std::vector<double> iteration(m.iterates.size());
  std::iota(iteration.begin(), iteration.end(), 0.0);
  DemoTable table;
  table.Add("iteration", iteration);
  table.Add("mean_norm", d.mean_norm);
  const std::size_t width = d.eigenvalues.front().size();
  const std::size_t shown = std::min<std::size_t>(width, 8);
  std::vector<PlotSeries> spectrum;
  for (std::size_t k = 0; k < shown; ++k) {
    std::vector<double> column;
    for (const std::vector<double>& m_t : d.mean) column.push_back(m_t[k]);
    table.Add("mean_" + std::to_string(k + 1), column);
  }
  for (std::size_t k = 0; k < shown; ++k) {
    std::vector<double> column;
    for (const std::vector<double>& e : d.eigenvalues) column.push_back(e[k]);
    table.Add("eigenvalue_" + std::to_string(k + 1), column);
    spectrum.push_back({"eigenvalue " + std::to_string(k + 1), iteration, column, false});
  }
  table.Add("alignment", m.alignment);
  table.Add("tangent", m.tangent);
  table.Add("residual", m.residual);
  WriteTextFile((dir / "hidden_state.csv").string(), table.ToCsv());

  PlotOptions plot;
  plot.title = "Covariance spectrum of the hidden states over the solve";
  plot.x_label = "iteration";
  plot.y_label = "eigenvalue";
  plot.log_y = true;
  plot.width = 760;
  WriteTextFile((dir / "spectrum.svg").string(), LinePlotSvg(spectrum, plot));

  std::vector<double> predicted;
  const std::vector<double>& measured = o.run.empty() ? m.tangent : m.residual;
  const std::size_t anchor = static_cast<std::size_t>(o.burn_in);
  for (std::size_t t = 0; t < iteration.size(); ++t) {
    predicted.push_back(measured[anchor] *
                        std::pow(m.rate_predicted, static_cast<double>(t) - anchor));
  }
  plot.title = o.run.empty() ? "Tokens approach the layer-norm equilibrium"
                             : "Residual of the model's fixed-point iteration";
  plot.y_label = o.run.empty() ? "median tan(angle to top eigenvector)" : "relative residual";
  WriteTextFile((dir / "convergence.svg").string(),
                LinePlotSvg({{"measured", iteration, measured, true},
                             {"predicted rate", iteration, predicted, false}},
                            plot));

  DemoSummary summary;
  summary.SetText("demo", "hidden-state");
  summary.SetText("source", o.run.empty() ? "layer-norm equilibrium (S7b)" : o.run);
  summary.Set("ln_rate_measured", m.rate_measured);
  summary.Set("ln_rate_predicted", m.rate_predicted);
  if (o.run.empty()) {
    summary.Set("lambda_1", m.lambda1);
    summary.Set("lambda_2", m.lambda2);
    summary.Set("jacobian_radius", m.jacobian_radius);
  }
  summary.Set("final_alignment", m.alignment.back());
  summary.Set("final_top_eigenvalue_fraction",
              d.eigenvalues.back().front() /
                  std::max(std::accumulate(d.eigenvalues.back().begin(),
                                           d.eigenvalues.back().end(), 0.0),
                           1e-300));
  summary.Set("iterations", static_cast<double>(o.iterations));
  WriteTextFile((dir / "summary.json").string(), summary.ToJson());
  out << "rate measured " << m.rate_measured << ", predicted " << m.rate_predicted << "; wrote "
      << o.out_dir << "/{hidden_state.csv, spectrum.svg, convergence.svg, summary.json}\n";
  return {m.rate_measured, m.rate_predicted};
}

}  // namespace stillpoint
