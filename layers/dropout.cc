#include "layers/dropout.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <sstream>

#include "framework/ops.h"

namespace stillpoint {
namespace {

// Visits module and its descendants (iteratively: trees may be deep).
template <typename Fn>
void ForEachModule(Module& root, Fn&& fn) {
  std::vector<Module*> stack = {&root};
  while (!stack.empty()) {
    Module* module = stack.back();
    stack.pop_back();
    fn(*module);
    for (const auto& [name, child] : module->children()) stack.push_back(child.get());
  }
}

}  // namespace

Dropout::Dropout(const DropoutOptions& options) : p_(options.p), rng_(options.seed) {
  std::string error;
  SP_CHECK(options.IsValid(&error), "Dropout: ", error);
}

std::string Dropout::Name() const {
  std::ostringstream out;
  out << "Dropout(p " << p_ << (frozen_ ? ", frozen mask" : "") << ")";
  return out.str();
}

Tensor Dropout::DrawMask(const Shape& shape, DType dtype) {
  Tensor mask(shape, dtype);
  const double keep_scale = 1.0 / (1.0 - p_);
  DispatchDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* data = mask.data<T>();
    for (int64_t i = 0; i < mask.numel(); ++i) {
      data[i] = rng_.Uniform() < p_ ? T{0} : static_cast<T>(keep_scale);
    }
  });
  return mask;
}

Var Dropout::Forward(const Var& x) {
  SP_CHECK(x.defined() && x.rank() >= 1, "Dropout: input must be a defined tensor of rank >= 1");
  std::vector<int64_t> ids(x.dim(0));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return Forward(x, ids);
}

Var Dropout::Forward(const Var& x, const std::vector<int64_t>& sample_ids) {
  SP_CHECK(x.defined() && x.rank() >= 1, "Dropout: input must be a defined tensor of rank >= 1");
  SP_CHECK(static_cast<int64_t>(sample_ids.size()) == x.dim(0), "Dropout: ", sample_ids.size(),
           " sample ids for input ", x.shape(), " (one id per row)");
  if (!is_training() || p_ == 0.0) return x;
  if (!frozen_) return mul(x, constant(DrawMask(x.shape(), x.dtype())));

  if (!mask_.defined()) {
    int64_t samples = 0;
    for (int64_t id : sample_ids) {
      SP_CHECK(id >= 0, "Dropout: negative sample id ", id);
      samples = std::max(samples, id + 1);
    }
    std::vector<int64_t> dims = x.shape().dims();
    dims[0] = samples;
    mask_ = DrawMask(Shape(dims), x.dtype());
  }
  const Shape& mask_shape = mask_.shape();
  bool same_rows = mask_shape.rank() == x.rank() && mask_.dtype() == x.dtype();
  for (int axis = 1; same_rows && axis < x.rank(); ++axis) {
    same_rows = mask_shape[axis] == x.dim(axis);
  }
  SP_CHECK(same_rows, "Dropout: the frozen mask ", mask_shape, " (",
           stillpoint::ToString(mask_.dtype()), ") does not fit input ", x.shape(), " (",
           stillpoint::ToString(x.dtype()), "); release the mask when the sample shape changes");
  bool identity = static_cast<int64_t>(sample_ids.size()) == mask_shape[0];
  for (std::size_t r = 0; r < sample_ids.size(); ++r) {
    SP_CHECK(sample_ids[r] >= 0 && sample_ids[r] < mask_shape[0], "Dropout: sample id ",
             sample_ids[r], " is outside the frozen mask's ", mask_shape[0],
             " samples; the first Forward after FreezeMask() must include every sample");
    identity = identity && sample_ids[r] == static_cast<int64_t>(r);
  }
  if (identity) return mul(x, constant(mask_));
  Var rows;
  {
    NoGrad no_grad;
    rows = gather(constant(mask_), 0, sample_ids);
  }
  return mul(x, constant(rows.value()));
}

void Dropout::FreezeMask() { frozen_ = true; }

void Dropout::ReleaseMask() {
  frozen_ = false;
  mask_ = Tensor();
}

void FreezeDropoutMasks(Module& module) {
  ForEachModule(module, [](Module& m) {
    if (auto* dropout = dynamic_cast<Dropout*>(&m)) dropout->FreezeMask();
  });
}

void ReleaseDropoutMasks(Module& module) {
  ForEachModule(module, [](Module& m) {
    if (auto* dropout = dynamic_cast<Dropout*>(&m)) dropout->ReleaseMask();
  });
}

const OptionFields<DropoutOptions>& DropoutOptions::Fields() {
  using O = DropoutOptions;
  static const auto* fields =
      &(new OptionFields<O>)
           ->Double("p", &O::p, OptionBounds{0.0, 1.0, false, true},
                    "Probability of zeroing an entry, in [0, 1)")
           // Printed through a double, like every integer field: exact below
           // 2^53, which any seed written by hand is.
           .Int("seed", &O::seed,
                OptionBounds::Closed(0.0, static_cast<double>(std::numeric_limits<uint64_t>::max())),
                "Seed of the layer's own random stream (masks are reproducible)");
  return *fields;
}

bool DropoutOptions::IsValid(std::string* error) const {
  const std::string problem = Fields().Check(*this);
  if (!problem.empty() && error != nullptr) *error = "DropoutOptions: " + problem;
  return problem.empty();
}

std::string DropoutOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

}  // namespace stillpoint
