#include "tests/solvers/problems.h"

#include <Eigen/Dense>
#include <cmath>
#include <functional>
#include <limits>

#include "framework/check.h"
#include "framework/random.h"

namespace stillpoint {
namespace zoo {
namespace {

using Matrix = Eigen::MatrixXd;
using Vector = Eigen::VectorXd;

// One sample's f: reads z (n values), writes f(z); false if it cannot.
using RowMap = std::function<bool(int64_t sample, const double* z, double* out)>;
// One sample's J_f(z) v.
using RowJvp = std::function<bool(int64_t sample, const double* z, const double* v, double* out)>;
// One sample's energy and gradient.
using RowEnergy =
    std::function<bool(int64_t sample, const double* z, double* energy, double* gradient)>;

void ReadRow(const Tensor& t, int64_t row, double* out) {
  const int64_t n = t.dim(1);
  DispatchDType(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = t.data<T>() + row * n;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(p[i]);
  });
}

void WriteRow(const double* values, int64_t row, Tensor* t) {
  const int64_t n = t->dim(1);
  DispatchDType(t->dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = t->data<T>() + row * n;
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(values[i]);
  });
}

BatchedMap MakeMap(std::shared_ptr<CallLog> log, int64_t n, RowMap row) {
  return [log, n, row](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    SP_CHECK(z.rank() == 2 && z.dim(0) == static_cast<int64_t>(ids.size()) && z.dim(1) == n,
             "zoo map: z has shape ", z.shape(), " for ", ids.size(), " samples of size ", n);
    log->map_rows += static_cast<int64_t>(ids.size());
    if (log->log_calls) log->map_calls.push_back(ids);
    std::vector<double> zin(n);
    std::vector<double> fout(n);
    for (size_t i = 0; i < ids.size(); ++i) {
      ReadRow(z, static_cast<int64_t>(i), zin.data());
      if (!row(ids[i], zin.data(), fout.data())) return false;
      WriteRow(fout.data(), static_cast<int64_t>(i), out);
    }
    return true;
  };
}

BatchedJvp MakeJvp(std::shared_ptr<CallLog> log, int64_t n, RowJvp row) {
  return [log, n, row](const Tensor& z, const Tensor& v, const std::vector<int64_t>& ids,
                       Tensor* out) {
    log->jvp_rows += static_cast<int64_t>(ids.size());
    std::vector<double> zin(n);
    std::vector<double> vin(n);
    std::vector<double> jout(n);
    for (size_t i = 0; i < ids.size(); ++i) {
      ReadRow(z, static_cast<int64_t>(i), zin.data());
      ReadRow(v, static_cast<int64_t>(i), vin.data());
      if (!row(ids[i], zin.data(), vin.data(), jout.data())) return false;
      WriteRow(jout.data(), static_cast<int64_t>(i), out);
    }
    return true;
  };
}

BatchedEnergy MakeEnergy(std::shared_ptr<CallLog> log, int64_t n, RowEnergy row) {
  return [log, n, row](const Tensor& z, const std::vector<int64_t>& ids, Tensor* energy,
                       Tensor* gradient) {
    log->energy_rows += static_cast<int64_t>(ids.size());
    std::vector<double> zin(n);
    std::vector<double> grad(n);
    for (size_t i = 0; i < ids.size(); ++i) {
      ReadRow(z, static_cast<int64_t>(i), zin.data());
      double e = 0.0;
      if (!row(ids[i], zin.data(), &e, grad.data())) return false;
      energy->set(static_cast<int64_t>(i), e);
      WriteRow(grad.data(), static_cast<int64_t>(i), gradient);
    }
    return true;
  };
}

Tensor FromRows(const std::vector<Vector>& rows) {
  const int64_t batch = static_cast<int64_t>(rows.size());
  const int64_t n = rows.front().size();
  Tensor t(Shape{batch, n}, DType::kFloat64);
  for (int64_t b = 0; b < batch; ++b) WriteRow(rows[b].data(), b, &t);
  return t;
}

Matrix GaussianMatrix(int64_t rows, int64_t cols, Rng& rng) {
  Matrix m(rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) m(i, j) = rng.Normal();
  }
  return m;
}

Vector GaussianVector(int64_t n, Rng& rng) {
  Vector v(n);
  for (int64_t i = 0; i < n; ++i) v(i) = rng.Normal();
  return v;
}

// m is square, so the one-sided Jacobi SVD needs no QR preconditioner; its
// instantiation compiles far faster than BDCSVD's or a preconditioned one's.
Matrix WithSpectralNorm(const Matrix& m, double norm) {
  SP_CHECK(m.rows() == m.cols(), "WithSpectralNorm: m is ", m.rows(), "x", m.cols());
  const Eigen::JacobiSVD<Matrix, Eigen::NoQRPreconditioner> svd(m);
  return m * (norm / svd.singularValues()(0));
}

// Plain iteration to machine precision, for reference solutions of maps that
// are contractions from `start`.
Vector IterateToFixedPoint(const RowMap& map, int64_t sample, Vector z, int iterations) {
  Vector next(z.size());
  for (int k = 0; k < iterations; ++k) {
    map(sample, z.data(), next.data());
    z = next;
  }
  return z;
}

}  // namespace

// ---- scalar cos ----

ZooProblem MakeCosProblem() {
  ZooProblem p;
  p.name = "cos";
  const int64_t n = 1;
  RowMap row = [](int64_t, const double* z, double* out) {
    out[0] = std::cos(z[0]);
    return true;
  };
  p.problem.map = MakeMap(p.log, n, row);
  p.problem.jvp = MakeJvp(p.log, n, [](int64_t, const double* z, const double* v, double* out) {
    out[0] = -std::sin(z[0]) * v[0];
    return true;
  });
  p.problem.energy = MakeEnergy(p.log, n, [](int64_t, const double* z, double* e, double* grad) {
    *e = 0.5 * z[0] * z[0] - std::sin(z[0]);
    grad[0] = z[0] - std::cos(z[0]);
    return true;
  });
  p.problem.batch_size = 3;
  p.problem.state_size = n;
  p.initial_point = Tensor::FromVector(Shape{3, 1}, {0.0, 1.0, -1.0}, DType::kFloat64);
  const double root = 0.7390851332151607;
  p.solution = Tensor::FromVector(Shape{3, 1}, {root, root, root}, DType::kFloat64);
  return p;
}

// ---- affine contraction ----

ZooProblem MakeAffineContraction(int64_t n, int64_t batch, double norm, uint64_t seed) {
  ZooProblem p;
  p.name = n == 200 ? "affine200" : "affine" + std::to_string(n);
  Rng rng(seed);
  auto w = std::make_shared<Matrix>(WithSpectralNorm(GaussianMatrix(n, n, rng), norm));
  auto b = std::make_shared<std::vector<Vector>>();
  for (int64_t s = 0; s < batch; ++s) b->push_back(GaussianVector(n, rng));
  p.problem.map = MakeMap(p.log, n, [w, b, n](int64_t sample, const double* z, double* out) {
    Eigen::Map<const Vector> zv(z, n);
    Eigen::Map<Vector> o(out, n);
    o.noalias() = (*w) * zv;
    o += (*b)[sample];
    return true;
  });
  p.problem.jvp = MakeJvp(p.log, n, [w, n](int64_t, const double*, const double* v, double* out) {
    Eigen::Map<const Vector> vv(v, n);
    Eigen::Map<Vector> o(out, n);
    o.noalias() = (*w) * vv;
    return true;
  });
  p.problem.batch_size = batch;
  p.problem.state_size = n;
  p.initial_point = Tensor::Zeros(Shape{batch, n}, DType::kFloat64);
  const Eigen::PartialPivLU<Matrix> lu(Matrix::Identity(n, n) - *w);
  std::vector<Vector> solutions;
  for (int64_t s = 0; s < batch; ++s) solutions.push_back(lu.solve((*b)[s]));
  p.solution = FromRows(solutions);
  return p;
}

// ---- tanh(W z + U x + c) ----

ZooProblem MakeTanhProblem(uint64_t seed) {
  ZooProblem p;
  p.name = "tanh";
  const int64_t n = 32;
  const int64_t input = 8;
  const int64_t batch = 4;
  Rng rng(seed);
  auto w = std::make_shared<Matrix>(WithSpectralNorm(GaussianMatrix(n, n, rng), 0.8));
  auto injection = std::make_shared<std::vector<Vector>>();
  const Matrix u = GaussianMatrix(n, input, rng) / std::sqrt(static_cast<double>(input));
  const Vector c = 0.1 * GaussianVector(n, rng);
  for (int64_t s = 0; s < batch; ++s) injection->push_back(u * GaussianVector(input, rng) + c);
  RowMap row = [w, injection, n](int64_t sample, const double* z, double* out) {
    Eigen::Map<const Vector> zv(z, n);
    Eigen::Map<Vector> o(out, n);
    o.noalias() = (*w) * zv;
    o = (o + (*injection)[sample]).array().tanh().matrix();
    return true;
  };
  p.problem.map = MakeMap(p.log, n, row);
  p.problem.jvp = MakeJvp(
      p.log, n, [w, injection, n](int64_t sample, const double* z, const double* v, double* out) {
        Eigen::Map<const Vector> zv(z, n);
        Eigen::Map<const Vector> vv(v, n);
        Eigen::Map<Vector> o(out, n);
        const Vector pre = (*w) * zv + (*injection)[sample];
        const Vector wv = (*w) * vv;
        o = (1.0 - pre.array().tanh().square()).matrix().cwiseProduct(wv);
        return true;
      });
  p.problem.batch_size = batch;
  p.problem.state_size = n;
  p.initial_point = Tensor::Zeros(Shape{batch, n}, DType::kFloat64);
  std::vector<Vector> solutions;
  for (int64_t s = 0; s < batch; ++s) {
    solutions.push_back(IterateToFixedPoint(row, s, Vector::Zero(n), 400));
  }
  p.solution = FromRows(solutions);
  return p;
}

// ---- Hopfield retrieval ----

ZooProblem MakeHopfieldProblem(double beta, uint64_t seed) {
  ZooProblem p;
  p.name = "hopfield";
  const int64_t d = 16;
  const int64_t patterns = 6;
  const int64_t batch = 4;
  Rng rng(seed);
  auto x = std::make_shared<Matrix>(d, patterns);  // columns are the stored patterns, |x| = 1
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < patterns; ++j) {
      (*x)(i, j) = (rng.Uniform() < 0.5 ? -1.0 : 1.0) / std::sqrt(static_cast<double>(d));
    }
  }
  auto softmax = [x, beta](const double* z, int64_t dim) {
    Eigen::Map<const Vector> zv(z, dim);
    Vector logits = beta * (x->transpose() * zv);
    logits.array() -= logits.maxCoeff();
    Vector weights = logits.array().exp().matrix();
    weights /= weights.sum();
    return weights;
  };
  RowMap row = [x, softmax, d](int64_t, const double* z, double* out) {
    Eigen::Map<Vector> o(out, d);
    o.noalias() = (*x) * softmax(z, d);
    return true;
  };
  p.problem.map = MakeMap(p.log, d, row);
  p.problem.jvp = MakeJvp(
      p.log, d, [x, softmax, beta, d](int64_t, const double* z, const double* v, double* out) {
        // J = beta X (diag(p) - p p^T) X^T.
        const Vector weights = softmax(z, d);
        Eigen::Map<const Vector> vv(v, d);
        const Vector xv = x->transpose() * vv;
        const Vector inner = weights.cwiseProduct(xv) - weights * weights.dot(xv);
        Eigen::Map<Vector> o(out, d);
        o.noalias() = beta * ((*x) * inner);
        return true;
      });
  p.problem.energy = MakeEnergy(
      p.log, d, [x, softmax, beta, d](int64_t, const double* z, double* e, double* grad) {
        Eigen::Map<const Vector> zv(z, d);
        const Vector logits = beta * (x->transpose() * zv);
        const double top = logits.maxCoeff();
        const double lse = top + std::log((logits.array() - top).exp().sum());
        *e = 0.5 * zv.squaredNorm() - lse / beta;
        Eigen::Map<Vector> g(grad, d);
        g = zv - (*x) * softmax(z, d);
        return true;
      });
  p.problem.batch_size = batch;
  p.problem.state_size = d;
  // Queries: stored patterns with a quarter of their entries zeroed.
  std::vector<Vector> starts;
  std::vector<Vector> solutions;
  for (int64_t s = 0; s < batch; ++s) {
    Vector query = x->col(s);
    for (int64_t i = 0; i < d / 4; ++i) query((s * 5 + i * 3) % d) = 0.0;
    starts.push_back(query);
    solutions.push_back(IterateToFixedPoint(row, s, query, 200));
  }
  p.initial_point = FromRows(starts);
  p.solution = FromRows(solutions);
  return p;
}

// ---- layer-norm power iteration (docs/seeds.md S7b) ----

ZooProblem MakeLayerNormEigenProblem(uint64_t seed) {
  ZooProblem p;
  p.name = "layernorm_eig";
  const int64_t d = 12;
  const int64_t batch = 2;
  Rng rng(seed);
  // Sigma = Q diag(s) Q^T with a clear top eigenvalue; Q orthonormalises
  // Gaussian columns (modified Gram-Schmidt).
  Matrix q = GaussianMatrix(d, d, rng);
  for (int64_t j = 0; j < d; ++j) {
    for (int64_t i = 0; i < j; ++i) q.col(j) -= q.col(i).dot(q.col(j)) * q.col(i);
    q.col(j) /= q.col(j).norm();
  }
  Vector spectrum(d);
  for (int64_t i = 0; i < d; ++i) spectrum(i) = i == 0 ? 5.0 : 2.0 / (1.0 + i);
  auto a =
      std::make_shared<Matrix>(Matrix::Identity(d, d) + q * spectrum.asDiagonal() * q.transpose());
  RowMap row = [a, d](int64_t, const double* z, double* out) {
    Eigen::Map<const Vector> zv(z, d);
    Vector y = (*a) * zv;
    y.array() -= y.mean();
    const double std_dev = std::sqrt(y.squaredNorm() / static_cast<double>(d));
    Eigen::Map<Vector> o(out, d);
    o = y / std_dev;  // eps = 0: NaN only for a constant y
    return true;
  };
  p.problem.map = MakeMap(p.log, d, row);  // no jvp: solvers use finite differences
  p.problem.batch_size = batch;
  p.problem.state_size = d;
  const Matrix projector =
      Matrix::Identity(d, d) - Matrix::Constant(d, d, 1.0 / static_cast<double>(d));
  // Top eigenvector of the PSD matrix P(I + Sigma)P by power iteration (its
  // eigenvalue ratio is about 0.5, so 400 steps reach machine precision).
  const Matrix projected = projector * (*a) * projector;
  Vector top = projector * Vector::LinSpaced(d, 1.0, 2.0);
  for (int k = 0; k < 400; ++k) {
    top = projected * top;
    top /= top.norm();
  }
  top *= std::sqrt(static_cast<double>(d));
  std::vector<Vector> starts;
  std::vector<Vector> solutions;
  for (int64_t s = 0; s < batch; ++s) {
    // Inside the basin of +-top: the sign of the start's component is kept.
    const double sign = s % 2 == 0 ? 1.0 : -1.0;
    Vector noise = GaussianVector(d, rng);
    noise *= 0.5 * std::sqrt(static_cast<double>(d)) / noise.norm();
    starts.push_back(sign * top + noise);
    solutions.push_back(sign * top);
  }
  p.initial_point = FromRows(starts);
  p.solution = FromRows(solutions);
  return p;
}

// ---- samples that converge at different iterations ----

ZooProblem MakeMixedBatchProblem() {
  ZooProblem p;
  p.name = "mixed_batch";
  const int64_t n = 6;
  const int64_t batch = 4;
  auto slope = std::make_shared<std::vector<double>>(std::vector<double>{0.5, 0.5, 0.9, 0.7});
  auto offset = std::make_shared<std::vector<Vector>>();
  for (int64_t s = 0; s < batch; ++s) {
    offset->push_back(Vector::LinSpaced(n, -1.0, 1.0) * (0.5 + 0.25 * static_cast<double>(s)));
  }
  RowMap row = [slope, offset, n](int64_t sample, const double* z, double* out) {
    for (int64_t i = 0; i < n; ++i) {
      out[i] = (*slope)[sample] * std::tanh(z[i]) + (*offset)[sample](i);
    }
    return true;
  };
  p.problem.map = MakeMap(p.log, n, row);
  p.problem.jvp =
      MakeJvp(p.log, n, [slope, n](int64_t sample, const double* z, const double* v, double* out) {
        for (int64_t i = 0; i < n; ++i) {
          const double t = std::tanh(z[i]);
          out[i] = (*slope)[sample] * (1.0 - t * t) * v[i];
        }
        return true;
      });
  p.problem.energy = MakeEnergy(
      p.log, n, [slope, offset, n](int64_t sample, const double* z, double* e, double* grad) {
        const double a = (*slope)[sample];
        *e = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const double c = (*offset)[sample](i);
          *e += 0.5 * z[i] * z[i] - a * std::log(std::cosh(z[i])) - c * z[i];
          grad[i] = z[i] - a * std::tanh(z[i]) - c;
        }
        return true;
      });
  p.problem.batch_size = batch;
  p.problem.state_size = n;
  std::vector<Vector> solutions;
  for (int64_t s = 0; s < batch; ++s) {
    Vector z = Vector::Zero(n);
    for (int64_t i = 0; i < n; ++i) {
      // Newton on z - a tanh z - c (monotone, since a < 1).
      double x = 0.0;
      for (int k = 0; k < 100; ++k) {
        const double t = std::tanh(x);
        x -= (x - (*slope)[s] * t - (*offset)[s](i)) / (1.0 - (*slope)[s] * (1.0 - t * t));
      }
      z(i) = x;
    }
    solutions.push_back(z);
  }
  std::vector<Vector> starts = {solutions[0],                              // at the solution
                                solutions[1] + Vector::Constant(n, 1e-3),  // close
                                Vector::Constant(n, 5.0),                  // far, slow map
                                Vector::Constant(n, -2.0)};                // medium
  p.initial_point = FromRows(starts);
  p.solution = FromRows(solutions);
  return p;
}

// ---- a map without a fixed point ----

namespace {
// f(z) - z per entry: at least 1/2, and growing with |z| so that f(z) = z
// cannot hold even in floating point (z + 1.5 == z for huge z).
double Gap(double z) { return 1.0 + 0.5 * std::sin(z) + 0.5 * std::abs(z); }
}  // namespace

ZooProblem MakeNoFixedPointProblem() {
  ZooProblem p;
  p.name = "no_fixed_point";
  p.expectation = Expectation::kNoFixedPoint;
  p.contractive = false;
  const int64_t n = 4;
  p.problem.map = MakeMap(p.log, n, [n](int64_t, const double* z, double* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = z[i] + Gap(z[i]);
    return true;
  });
  p.problem.jvp = MakeJvp(p.log, n, [n](int64_t, const double* z, const double* v, double* out) {
    for (int64_t i = 0; i < n; ++i) {
      out[i] = (1.0 + 0.5 * std::cos(z[i]) + 0.5 * (z[i] >= 0 ? 1.0 : -1.0)) * v[i];
    }
    return true;
  });
  p.problem.energy = MakeEnergy(p.log, n, [n](int64_t, const double* z, double* e, double* grad) {
    *e = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      *e += -z[i] + 0.5 * std::cos(z[i]) - 0.25 * z[i] * std::abs(z[i]);
      grad[i] = -Gap(z[i]);
    }
    return true;
  });
  p.problem.batch_size = 2;
  p.problem.state_size = n;
  p.initial_point =
      Tensor::FromVector(Shape{2, n}, {0, 0.5, 1, 1.5, -1, -2, 3, 0.25}, DType::kFloat64);
  return p;
}

// ---- a map that emits NaN ----

ZooProblem MakeNanProblem() {
  ZooProblem p;
  p.name = "nan_map";
  p.expectation = Expectation::kNonFinite;
  p.contractive = false;
  const int64_t n = 3;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto outside = [n](const double* z) {
    for (int64_t i = 0; i < n; ++i) {
      if (z[i] > 1.0) return true;
    }
    return false;
  };
  p.problem.map = MakeMap(p.log, n, [n, nan, outside](int64_t, const double* z, double* out) {
    const bool bad = outside(z);
    for (int64_t i = 0; i < n; ++i) out[i] = bad ? nan : 0.5 * z[i] + 2.0;
    return true;
  });
  p.problem.jvp =
      MakeJvp(p.log, n, [n, nan, outside](int64_t, const double* z, const double* v, double* out) {
        const bool bad = outside(z);
        for (int64_t i = 0; i < n; ++i) out[i] = bad ? nan : 0.5 * v[i];
        return true;
      });
  p.problem.energy =
      MakeEnergy(p.log, n, [n, nan, outside](int64_t, const double* z, double* e, double* grad) {
        const bool bad = outside(z);
        *e = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          *e += 0.25 * z[i] * z[i] - 2.0 * z[i];
          grad[i] = bad ? nan : 0.5 * z[i] - 2.0;
        }
        if (bad) *e = nan;
        return true;
      });
  p.problem.batch_size = 2;
  p.problem.state_size = n;
  p.initial_point =
      Tensor::FromVector(Shape{2, n}, {0.0, 0.0, 0.0, -1.0, -0.5, 0.5}, DType::kFloat64);
  return p;
}

std::vector<ZooProblem> ConvergentZoo() {
  return {MakeCosProblem(),      MakeAffineContraction(),     MakeTanhProblem(),
          MakeHopfieldProblem(), MakeLayerNormEigenProblem(), MakeMixedBatchProblem()};
}

std::vector<ZooProblem> FullZoo() {
  std::vector<ZooProblem> all = ConvergentZoo();
  all.push_back(MakeNoFixedPointProblem());
  all.push_back(MakeNanProblem());
  return all;
}

std::vector<double> ResidualNorms(const ZooProblem& problem, const Tensor& z) {
  const int64_t batch = problem.problem.batch_size;
  const int64_t n = problem.problem.state_size;
  const Tensor z64 = z.To(DType::kFloat64);
  Tensor fz(Shape{batch, n}, DType::kFloat64);
  std::vector<int64_t> ids(batch);
  for (int64_t b = 0; b < batch; ++b) ids[b] = b;
  SP_CHECK(problem.problem.map(z64, ids, &fz), "ResidualNorms: the map failed");
  std::vector<double> norms(batch, 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    double sq = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = fz.at(b * n + i) - z64.at(b * n + i);
      sq += d * d;
    }
    norms[b] = std::sqrt(sq);
  }
  return norms;
}

FixedPointProblem MakeSlowTridiagonalMap(int64_t n, int64_t batch, double frequency) {
  FixedPointProblem p;
  p.batch_size = batch;
  p.state_size = n;
  p.map = [n, frequency](const Tensor& z, const std::vector<int64_t>& ids, Tensor* out) {
    for (size_t r = 0; r < ids.size(); ++r) {
      const double* zr = z.data<double>() + r * n;
      double* o = out->data<double>() + r * n;
      for (int64_t i = 0; i < n; ++i) {
        const double left = i > 0 ? zr[i - 1] : 0.0;
        const double right = i + 1 < n ? zr[i + 1] : 0.0;
        o[i] = 0.475 * (left + right) + std::sin(frequency * i * (ids[r] + 1));
      }
    }
    return true;
  };
  return p;
}

}  // namespace zoo
}  // namespace stillpoint
