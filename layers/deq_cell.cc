#include "layers/deq_cell.h"

#include <sstream>

#include "framework/ops.h"

namespace stillpoint {
namespace {

// Stops at the first nonzero entry, so a state that is not zero costs
// almost nothing to rule out.
bool IsAllZero(const Tensor& x) {
  return DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* data = x.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (data[i] != T(0)) return false;
    }
    return true;
  });
}

}  // namespace

DEQCell::DEQCell(const CellOptions& options, Rng& rng) : options_(options) {
  SP_CHECK(options.extra.empty(), "DEQCell: unknown option '",
           (options.extra.empty() ? "" : options.extra.begin()->first),
           "' in extra (the cell has none)");
  SP_CHECK(options.hidden > 0, "DEQCell: hidden must be positive, got ", options.hidden);
  if (options.attention == "softmax") {
    const AttentionOptions attention{
        .causal = options.causal, .dtype = options.dtype, .layout = options.layout};
    attention_ = std::make_shared<MultiHeadAttention>(options.dim, options.heads, rng, attention);
    RegisterModule("wq", attention_->wq());
    RegisterModule("wk", attention_->wk());
    RegisterModule("wv", attention_->wv());
    RegisterModule("wo", attention_->wo());
  } else {
    EnergyAttentionOptions attention;
    attention.block = options.energy;
    attention.block.layer = options.attention;
    attention.block.dim = options.dim;
    attention.block.heads = options.heads;
    attention.block.causal = options.causal;
    attention.block.layout = options.layout;
    attention.block.dtype = options.dtype;
    if (options.attention_solver) attention.solver = *options.attention_solver;
    attention.warm_start = options.attention_warm_start;
    energy_attention_ =
        RegisterModule("attention", std::make_shared<EnergyAttention>(attention, rng));
  }
  const LayerNormOptions norm{.eps = options.ln_eps, .dtype = options.dtype};
  const LinearOptions linear{.dtype = options.dtype};
  ln1_ = RegisterModule("ln1", std::make_shared<LayerNorm>(options.dim, norm));
  fc1_ = RegisterModule("fc1", std::make_shared<Linear>(options.dim, options.hidden, rng, linear));
  fc2_ = RegisterModule("fc2", std::make_shared<Linear>(options.hidden, options.dim, rng, linear));
  ln2_ = RegisterModule("ln2", std::make_shared<LayerNorm>(options.dim, norm));
  if (options.dropout > 0.0) {
    attention_dropout_ = RegisterModule(
        "attention_dropout",
        std::make_shared<Dropout>(DropoutOptions{options.dropout, options.dropout_seed}));
    ffn_dropout_ = RegisterModule("ffn_dropout", std::make_shared<Dropout>(DropoutOptions{
                                                     options.dropout, options.dropout_seed + 1}));
  }
}

std::string DEQCell::Name() const {
  std::ostringstream out;
  out << "DEQCell(dim " << options_.dim << ", heads " << options_.heads << ", hidden "
      << options_.hidden << (options_.causal ? ", causal" : "");
  if (energy_attention_) out << ", " << options_.attention << " attention";
  if (options_.dropout > 0.0) out << ", dropout " << options_.dropout;
  out << ")";
  return out.str();
}

Var DEQCell::Forward(const Var& z, const Var& u, const std::vector<int64_t>& sample_ids) const {
  SP_CHECK(z.defined() && u.defined(), "DEQCell: an input is undefined");
  SP_CHECK(z.rank() == 3 && z.dim(2) == options_.dim && z.shape() == u.shape(), "DEQCell(dim ",
           options_.dim, "): state ", z.shape(), " and injection ", u.shape(),
           " must both be [k, T, ", options_.dim, "]");
  // An exactly zero state whose gradient nobody asks for (a solver's first
  // evaluation from z0 = 0) is the zero state: one attention row.
  if (!(GradModeEnabled() && z.requires_grad()) && IsAllZero(z.value())) {
    return ForwardAtZero(u, sample_ids);
  }
  return AfterAttention(z, Attend(z, sample_ids), u, sample_ids);
}

Var DEQCell::ForwardAtZero(const Var& u, const std::vector<int64_t>& sample_ids) const {
  SP_CHECK(u.defined(), "DEQCell: the injection is undefined");
  SP_CHECK(u.rank() == 3 && u.dim(2) == options_.dim, "DEQCell(dim ", options_.dim, "): injection ",
           u.shape(), " must be [k, T, ", options_.dim, "]");
  const Var attended = attention_ ? attention_->ForwardAtZero(u.dim(0), u.dim(1))
                                  : energy_attention_->Forward(zeros_like(u), sample_ids);
  return AfterAttention(Var(), attended, u, sample_ids);
}

bool DEQCell::SupportsStep(std::string* why) const {
  if (!attention_) {
    if (why != nullptr) {
      *why = "its attention (" + options_.attention + ") is an energy attention solved over "
             "every position at once";
    }
    return false;
  }
  return attention_->SupportsStep(why);
}

Var DEQCell::ForwardStep(const Var& z, const Var& u, const KeyValueCache& past,
                         KeyValueCache* next) const {
  std::string why;
  SP_CHECK(SupportsStep(&why), "DEQCell: no incremental step: ", why);
  SP_CHECK(z.defined() && u.defined() && z.shape() == u.shape(),
           "DEQCell: a step's state and injection must both be [B, n, ", options_.dim, "]");
  return AfterAttention(z, attention_->ForwardStep(z, past, next), u, {});
}

Var DEQCell::Attend(const Var& z, const std::vector<int64_t>& sample_ids) const {
  return attention_ ? attention_->Forward(z) : energy_attention_->Forward(z, sample_ids);
}

Var DEQCell::AfterAttention(const Var& residual,
                            Var attended,
                            const Var& u,
                            const std::vector<int64_t>& sample_ids) const {
  if (attention_dropout_) {
    attended = sample_ids.empty() ? attention_dropout_->Forward(attended)
                                  : attention_dropout_->Forward(attended, sample_ids);
  }
  // Residual sums go straight into the fused norms (same values as add then
  // LayerNorm, without the intermediate tensors).
  const Var h = residual.defined() ? ln1_->Forward(VarList{residual, attended, u})
                                   : ln1_->Forward(VarList{attended, u});
  Var ffn = fc1_->ForwardGeluThen(*fc2_, h);
  if (ffn_dropout_) {
    ffn = sample_ids.empty() ? ffn_dropout_->Forward(ffn) : ffn_dropout_->Forward(ffn, sample_ids);
  }
  return ln2_->Forward(VarList{h, ffn});
}

}  // namespace stillpoint
