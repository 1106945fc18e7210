#include "layers/models.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <sstream>

#include "framework/ops.h"
#include "framework/random.h"
#include "layers/dropout.h"
#include "layers/registry.h"
#include "solvers/regularizers.h"

namespace stillpoint {
namespace {

// The Hopfield layer of the pooling and of the lookup: the model's heads,
// normalised stored patterns and states, the query as an external field (in
// fixed-point mode the queries learn only through that field), solved to the
// fixed point with the inner-solve options of the model's energy attention.
HopfieldOptions ReadoutHopfieldOptions(const ModelOptions& o) {
  const int64_t heads = o.cell_options.heads;
  SP_CHECK(o.dim % heads == 0, "SequenceModel: dim (", o.dim, ") must be a multiple of heads (",
           heads, ") for the Hopfield ", o.pooling == "hopfield" ? "pooling" : "lookup");
  HopfieldOptions h;
  h.state_size = o.dim;
  h.heads = heads;
  h.head_dim = o.dim / heads;
  h.normalize_stored = true;
  h.normalize_state = true;
  h.query_field = true;
  h.contraction = o.energy.pattern_contraction;
  h.solve.mode = EnergySolveMode::kFixedPoint;
  h.solve.implicit = o.cell_options.attention_solver.value_or(DefaultAttentionSolverOptions());
  h.dtype = o.dtype;
  return h;
}

}  // namespace

const char* ToString(SolverInit init) {
  switch (init) {
    case SolverInit::kZeros:
      return "zeros";
    case SolverInit::kRandom:
      return "random";
    case SolverInit::kMixed:
      return "mixed";
  }
  return "unknown";
}

PathIndependence ScorePathIndependence(const Tensor& z_a, const Tensor& z_b,
                                       const Tensor& logits_a, const Tensor& logits_b) {
  SP_CHECK(z_a.shape() == z_b.shape() && z_a.rank() >= 1, "ScorePathIndependence: states ",
           z_a.shape(), " and ", z_b.shape(), " must have one shape [B, ...]");
  SP_CHECK(logits_a.shape() == logits_b.shape() && logits_a.rank() >= 1,
           "ScorePathIndependence: logits ", logits_a.shape(), " and ", logits_b.shape(),
           " must have one shape [..., C]");
  PathIndependence score;
  const int64_t samples = z_a.dim(0);
  if (samples == 0) return score;
  const int64_t per_sample = z_a.numel() / samples;
  const std::vector<double> a = z_a.ToVector(), b = z_b.ToVector();
  double cosine_sum = 0.0;
  for (int64_t s = 0; s < samples; ++s) {
    double dot = 0.0, norm_a = 0.0, norm_b = 0.0;
    for (int64_t i = s * per_sample; i < (s + 1) * per_sample; ++i) {
      dot += a[i] * b[i];
      norm_a += a[i] * a[i];
      norm_b += b[i] * b[i];
    }
    if (norm_a == 0.0 || norm_b == 0.0) {
      cosine_sum += (norm_a == 0.0 && norm_b == 0.0) ? 1.0 : 0.0;
    } else {
      cosine_sum += dot / std::sqrt(norm_a * norm_b);
    }
  }
  score.cosine = cosine_sum / static_cast<double>(samples);
  const int64_t classes = logits_a.dim(-1);
  const int64_t rows = classes > 0 ? logits_a.numel() / classes : 0;
  if (rows == 0) return score;
  const std::vector<double> la = logits_a.ToVector(), lb = logits_b.ToVector();
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row_a = la.begin() + r * classes, row_b = lb.begin() + r * classes;
    agree += (std::max_element(row_a, row_a + classes) - row_a) ==
             (std::max_element(row_b, row_b + classes) - row_b);
  }
  score.agreement = static_cast<double>(agree) / static_cast<double>(rows);
  return score;
}

const char* ToString(InputInjection injection) {
  switch (injection) {
    case InputInjection::kEveryStep:
      return "every_step";
    case InputInjection::kFirstStep:
      return "first_step";
  }
  return "unknown";
}

const char* ToString(ModelKind kind) {
  switch (kind) {
#define SP_MODEL_KIND_CASE(value, name, doc) \
  case ModelKind::value:                     \
    return name;
    SP_MODEL_KINDS(SP_MODEL_KIND_CASE)
#undef SP_MODEL_KIND_CASE
  }
  return "unknown";
}

const std::vector<ModelKind>& AllModelKinds() {
#define SP_MODEL_KIND_VALUE(value, name, doc) ModelKind::value,
  static const std::vector<ModelKind> all{SP_MODEL_KINDS(SP_MODEL_KIND_VALUE)};
#undef SP_MODEL_KIND_VALUE
  return all;
}

std::vector<std::string> ModelKindNames() {
  std::vector<std::string> names;
  for (ModelKind kind : AllModelKinds()) names.push_back(ToString(kind));
  return names;
}

std::string ModelKindsDoc() {
  std::string doc;
#define SP_MODEL_KIND_DOC(value, name, text) \
  doc += std::string(doc.empty() ? "" : "; ") + name + ": " + text;
  SP_MODEL_KINDS(SP_MODEL_KIND_DOC)
#undef SP_MODEL_KIND_DOC
  return doc;
}

bool StringToModelKind(const std::string& text, ModelKind* kind) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (ModelKind candidate : AllModelKinds()) {
    if (lower == ToString(candidate)) {
      *kind = candidate;
      return true;
    }
  }
  return false;
}

const OptionFields<ModelOptions>& ModelOptions::Fields() {
  using O = ModelOptions;
  constexpr double kInf = std::numeric_limits<double>::max();
  const OptionFields<CellOptions>& cell = CellOptions::Fields();
  static const auto* fields = [&] {
    // model.energy.*: the block's config fields (its dim, heads, causal and
    // dtype come from the model's).
    std::vector<std::string> energy_keys;
    for (const auto& field : EnergyBlockOptions::Fields().fields()) {
      if (field.in_config) energy_keys.push_back(field.name);
    }
    return &(new OptionFields<O>)
                ->Enum("kind", &O::kind, AllModelKinds(), stillpoint::ToString,
                       ModelKindsDoc())
                .String("cell", &O::cell, "Registered cell name (explicit, tied, implicit)")
                .Include("", &O::cell_options, cell, {"attention"})
                .Int("dim", &O::dim, 1, 1 << 16, "Model width d")
                .Include("", &O::cell_options, cell, {"heads", "hidden"})
                .Int("max_length", &O::max_length, 1, 1 << 20,
                     "positions learned: longest sequence the positional table covers (>= every "
                     "training and evaluation length; a longer one is an error)")
                .Enum("positions", &O::positions, AllPositionSchemes(), stillpoint::ToString,
                      "How the model knows where a token is (every attention, softmax or "
                      "energy): " + PositionSchemesDoc())
                .Enum("attention_mask", &O::attention_mask, AllAttentionMaskKinds(),
                      stillpoint::ToString,
                      "Which keys each query sees, in every attention (softmax or energy; inside "
                      "an energy's fixed point too): " + AttentionMasksDoc())
                .Int("attention_window", &O::attention_window, 0, 1 << 20,
                     "attention_mask causal: 0 (every earlier key) or W (the last W keys and the "
                     "query's own); local: the distance W >= 1; none: must be 0")
                .Enum("solver.init", &O::solver_init,
                      {SolverInit::kZeros, SolverInit::kRandom, SolverInit::kMixed},
                      stillpoint::ToString,
                      "implicit and energy: where each training solve starts: zeros (the energy "
                      "block's start), random (plus N(0, 1) per entry), mixed (N(0, 1) with half "
                      "its entries zeroed, TorchDEQ's mixed init); trains path independence. "
                      "Evaluation starts from zeros")
                .Enum("input_injection", &O::input_injection,
                      {InputInjection::kEveryStep, InputInjection::kFirstStep},
                      stillpoint::ToString,
                      "Where the embedded input u enters: every_step (every cell application "
                      "gets f(z; u), the DEQ's injection and Bansal et al.'s recall; z0 = 0; "
                      "every kind) or first_step (z0 = u and the cells get none, a plain "
                      "transformer stack; explicit and tied only)")
                .Int("num_layers", &O::num_layers, 1, 1024, "explicit: number of untied cells")
                .Int("unroll_steps", &O::unroll_steps, 1, 4096,
                     "tied: applications of the one cell; implicit/energy: steps of the tied "
                     "unroll during train.pretrain_steps")
                .Include("", &O::cell_options, cell, {"dropout", "ln_eps"})
                .Double("embedding_init_std", &O::embedding_init_std, 0.0, kInf,
                        "Standard deviation of the token and position tables")
                .Choice("pooling", &O::pooling, {"mean", "hopfield"},
                        "Classification tasks (one target per sequence): how the token states are "
                        "pooled before the head. mean, or hopfield: model.pooling_patterns learned "
                        "state patterns retrieve from the states at the fixed point of the "
                        "Hopfield energy (the patterns as an external field, so they learn through "
                        "the implicit gradient), solved by model.attention_solver.*; the patterns' "
                        "outputs are averaged")
                .Int("pooling_patterns", &O::pooling_patterns, 1, 4096,
                     "pooling hopfield only (an error otherwise): number of learned state "
                     "patterns")
                .Choice("lookup", &O::lookup, {"none", "hopfield"},
                        "An associative memory after the encoder, every kind: none, or hopfield: z "
                        "<- z + lookup(z), each token queries model.lookup_size learned stored "
                        "patterns and reads their learned targets at the fixed point of the "
                        "Hopfield energy (the token as an external field), solved by "
                        "model.attention_solver.*")
                .Int("lookup_size", &O::lookup_size, 1, 1 << 20,
                     "lookup hopfield only (an error otherwise): number of stored patterns")
                .Include("energy.", &O::energy, EnergyBlockOptions::Fields(), energy_keys)
                .Int("vocab_size", &O::vocab_size, 1, int64_t{1} << 40,
                     "Token ids are in [0, vocab_size)")
                .NotInConfig()
                .Int("feature_dim", &O::feature_dim, 0, 1 << 20,
                     "Numbers per input token (0: the inputs are token ids)")
                .NotInConfig()
                .Int("num_classes", &O::num_classes, 0, 1 << 20,
                     "Output classes (0: vocab_size, per-token models)")
                .NotInConfig()
                .Double("head_ln_eps", &O::head_ln_eps, 0.0, 1.0,
                        "Epsilon of the final layer norm")
                .NotInConfig()
                .Enum("dtype", &O::dtype, {DType::kFloat32, DType::kFloat64}, stillpoint::ToString,
                      "Number type of parameters and states")
                .NotInConfig();
  }();
  return *fields;
}

bool ModelOptions::IsValid(std::string* error) const {
  std::string problem = Fields().Check(*this);
  if (problem.empty() && cell_options.heads > 0 && dim % cell_options.heads == 0) {
    AttentionLayout layout;
    layout.positions = positions;
    layout.mask = attention_mask;
    layout.window = attention_window;
    problem = layout.Check(cell_options.heads, dim / cell_options.heads);
  }
  if (problem.empty() && (kind == ModelKind::kImplicit || kind == ModelKind::kEnergy) &&
      !implicit.IsValid(&problem)) {
    problem = "implicit: " + problem;
  }
  if (!problem.empty() && error != nullptr) *error = "ModelOptions: " + problem;
  return problem.empty();
}

std::string ModelOptions::ToString() const { return Fields().Describe(*this) + "\n"; }

SequenceModel::SequenceModel(const ModelOptions& options)
    : SequenceModel(options,
                    options.num_classes > 0 ? options.num_classes : options.vocab_size,
                    /*pool=*/false) {}

SequenceModel::SequenceModel(const ModelOptions& options, int64_t out_features, bool pool)
    : options_(options), pool_(pool), init_rng_(options.seed ^ 0x5eed1417u) {
  // Every field of the model's own, once (a config's were checked when read:
  // training/config_schema.cc).
  std::string error;
  SP_CHECK(options.IsValid(&error), "SequenceModel: ", error);
  SP_CHECK(out_features > 0, "SequenceModel: the head needs a positive number of outputs, got ",
           out_features, pool ? " (set num_classes)" : "");
  Rng rng(options.seed);
  const EmbeddingOptions embedding{.init_std = options.embedding_init_std, .dtype = options.dtype};
  if (options.feature_dim == 0) {
    token_embedding_ =
        std::make_shared<TokenEmbedding>(options.vocab_size, options.dim, rng, embedding);
  }
  if (options.positions == PositionScheme::kLearned) {
    position_embedding_ =
        std::make_shared<PositionalEmbedding>(options.max_length, options.dim, rng, embedding);
  }
  layout_ = std::make_shared<AttentionLayout>();
  layout_->positions = options.positions;
  layout_->mask = options.attention_mask;
  layout_->window = options.attention_window;
  // Registered as own parameters (not as child modules) so that they are
  // named tok_emb and pos_emb, as in the reference implementation.
  if (token_embedding_) RegisterParameter("tok_emb", token_embedding_->weight());
  if (position_embedding_) RegisterParameter("pos_emb", position_embedding_->weight());
  if (options.feature_dim > 0) {
    feature_embedding_ = RegisterModule(
        "feat_emb", std::make_shared<Linear>(options.feature_dim, options.dim, rng,
                                             LinearOptions{.dtype = options.dtype}));
  }
  lnf_ = RegisterModule(
      "lnf", std::make_shared<LayerNorm>(options.dim, LayerNormOptions{.eps = options.head_ln_eps,
                                                                       .dtype = options.dtype}));
  out_ = RegisterModule("out", std::make_shared<Linear>(options.dim, out_features, rng,
                                                        LinearOptions{.dtype = options.dtype}));

  CellOptions cell_options = options.cell_options;
  cell_options.dim = options.dim;
  cell_options.dtype = options.dtype;
  cell_options.layout = layout_;
  switch (options.kind) {
    case ModelKind::kExplicit: {
      auto list = RegisterModule("cells", std::make_shared<ModuleList>());
      for (int64_t l = 0; l < options.num_layers; ++l) {
        cells_.push_back(list->Append(CreateCell(options.cell, cell_options, rng)));
      }
      break;
    }
    case ModelKind::kTied:
      cells_.push_back(RegisterModule("cell", CreateCell(options.cell, cell_options, rng)));
      break;
    case ModelKind::kImplicit: {
      cells_.push_back(RegisterModule("cell", CreateCell(options.cell, cell_options, rng)));
      // Not registered: its only parameters are the cell's, already "cell.*".
      implicit_ = std::make_shared<Implicit>(cells_[0], options.implicit);
      break;
    }
    case ModelKind::kEnergy: {
      EnergyBlockOptions block = options.energy;
      // model.attention names the block when it is an energy attention.
      if (options.cell_options.attention != "softmax") block.layer = options.cell_options.attention;
      block.dim = options.dim;
      block.dtype = options.dtype;
      block.causal = options.cell_options.causal;
      block.layout = layout_;
      energy_block_ = RegisterModule("block", CreateEnergyBlock(block, rng));
      ffn_norm_ = RegisterModule(
          "ffn_ln", std::make_shared<LayerNorm>(
                        options.dim, LayerNormOptions{.eps = options.cell_options.ln_eps,
                                                      .dtype = options.dtype}));
      ffn_ = RegisterModule("ffn", std::make_shared<MLP>(options.dim, options.cell_options.hidden,
                                                         rng, LinearOptions{.dtype = options.dtype}));
      // Not registered: its only parameters are the block's layer's.
      implicit_ = std::make_shared<Implicit>(energy_block_->layer(), options.implicit);
      break;
    }
  }
  if (options.keep_attention_inputs) {
    for (const auto& [name, attention] : FindEnergyAttentions(*this)) attention->KeepInputs(true);
  }
  // After the cells, so that they do not change the initialisation of the
  // parameters before them.
  if (options.lookup == "hopfield") {
    lookup_ = RegisterModule("lookup", std::make_shared<HopfieldLookup>(
                                           ReadoutHopfieldOptions(options), options.lookup_size, rng));
  }
  if (options.pooling == "hopfield") {
    SP_CHECK(pool, "SequenceModel: pooling \"hopfield\" needs a model that pools its tokens "
                   "(a classifier); per-token models have no pooling");
    hopfield_pooling_ = RegisterModule(
        "pool", std::make_shared<HopfieldPooling>(ReadoutHopfieldOptions(options),
                                                  options.pooling_patterns, rng));
  }
}

std::vector<std::pair<std::string, std::shared_ptr<HopfieldAttention>>>
SequenceModel::HopfieldReadouts() const {
  std::vector<std::pair<std::string, std::shared_ptr<HopfieldAttention>>> layers;
  if (lookup_) layers.emplace_back("lookup.hopfield", lookup_->hopfield());
  if (hopfield_pooling_) layers.emplace_back("pool.hopfield", hopfield_pooling_->hopfield());
  return layers;
}

std::string SequenceModel::Name() const {
  std::ostringstream out;
  out << "SequenceModel(" << stillpoint::ToString(options_.kind) << ", "
      << (options_.kind == ModelKind::kEnergy ? energy_block_->Name() : options_.cell);
  if (options_.kind != ModelKind::kEnergy && options_.cell_options.attention != "softmax") {
    out << " with " << options_.cell_options.attention << " attention";
  }
  if (options_.kind == ModelKind::kExplicit) out << " x " << options_.num_layers;
  if (options_.kind == ModelKind::kTied) out << " unrolled " << options_.unroll_steps;
  out << ", vocab " << options_.vocab_size << ", dim " << options_.dim << ")";
  return out.str();
}

const std::shared_ptr<Cell>& SequenceModel::cell(int64_t index) const {
  SP_CHECK(index >= 0 && index < num_cells(), "SequenceModel: cell index ", index,
           " out of range [0, ", num_cells(), ")");
  return cells_[index];
}

Var SequenceModel::Embed(const std::vector<int64_t>& ids, const Shape& ids_shape) const {
  SP_CHECK(token_embedding_ != nullptr,
           "SequenceModel: this model reads feature vectors (feature_dim ", options_.feature_dim,
           "); use ForwardFeatures");
  SP_CHECK(ids_shape.rank() == 2, "SequenceModel: token ids must be [B, T], got ", ids_shape);
  return WithPositions(token_embedding_->Forward(ids, ids_shape));
}

Var SequenceModel::EmbedFrom(const std::vector<int64_t>& ids, int64_t first) const {
  SP_CHECK(token_embedding_ != nullptr,
           "SequenceModel: this model reads feature vectors (feature_dim ", options_.feature_dim,
           "); EmbedFrom needs token ids");
  const int64_t n = static_cast<int64_t>(ids.size());
  SP_CHECK(n >= 1 && first >= 0, "SequenceModel: EmbedFrom needs ids and a position >= 0");
  const Var tokens = token_embedding_->Forward(ids, Shape{1, n});
  if (!position_embedding_) return tokens;  // the attentions place the tokens
  SP_CHECK(first + n <= options_.max_length, "SequenceModel: positions up to ", first + n - 1,
           " exceed model.max_length ", options_.max_length);
  // Rows first..first+n-1 of P, broadcast as in WithPositions.
  return add(tokens, slice(position_embedding_->Positions(first + n), 0, first, first + n));
}

Var SequenceModel::EmbedFeatures(const Var& features) const {
  SP_CHECK(feature_embedding_ != nullptr,
           "SequenceModel: this model reads token ids (feature_dim 0); use Forward");
  SP_CHECK(features.rank() == 3 && features.dim(2) == options_.feature_dim,
           "SequenceModel: features must be [B, T, ", options_.feature_dim, "], got ",
           features.shape());
  return WithPositions(feature_embedding_->Forward(features));
}

Var SequenceModel::WithPositions(const Var& embedded) const {
  if (!position_embedding_) return embedded;  // the attentions place the tokens
  const int64_t length = embedded.dim(1);
  SP_CHECK(length <= options_.max_length, "SequenceModel: sequence length ", length,
           " exceeds model.max_length ", options_.max_length,
           " (the learned positions' table; the other model.positions schemes have no "
           "limit)");
  return add(embedded, position_embedding_->Positions(length));
}

void SequenceModel::SetGridWidth(int64_t grid_width) {
  SP_CHECK(grid_width >= 0, "SequenceModel: grid width must be >= 0, got ", grid_width);
  layout_->grid_width = grid_width;
}

void SequenceModel::SetDepthOverride(int64_t steps) {
  SP_CHECK(steps >= 0, "SequenceModel: depth override must be >= 0, got ", steps);
  depth_override_ = steps;
}

CellFn SequenceModel::FixedPointMap(const Var& u) const {
  if (options_.kind == ModelKind::kEnergy) {
    const EnergyBlockProblemPtr problem = energy_block_->Prepare(u);
    return MakeUpdateCellFor(problem->energy, problem->initial_state.value());
  }
  SP_CHECK(options_.kind == ModelKind::kImplicit && !cells_.empty(),
           "SequenceModel: a fixed-point map needs an implicit or energy model, not ",
           stillpoint::ToString(options_.kind));
  const std::shared_ptr<Cell> cell = cells_.front();
  const int64_t rows = u.dim(0);
  return [cell, u, rows](const Var& z, const std::vector<int64_t>& ids) {
    const bool all = static_cast<int64_t>(ids.size()) == rows;
    return cell->Forward(z, all ? u : gather(u, 0, ids), ids);
  };
}

const Tensor& SequenceModel::FixedPoint() const {
  SP_CHECK(implicit_ != nullptr, "SequenceModel: a ", stillpoint::ToString(options_.kind),
           " model solves no fixed point of its own");
  const Var& z_star = implicit_->last_result().z_star;
  SP_CHECK(z_star.defined(), "SequenceModel: no fixed point yet (run Forward first)");
  return z_star.value();
}

Var SequenceModel::FixedPointJacobianPenalty(const Var& u, int probes, Rng& rng) {
  return JacobianFrobeniusPenalty(FixedPointMap(u), FixedPoint(), probes, rng);
}

Var SequenceModel::FixedPointSpectralRadiusPenalty(const Var& u, double target,
                                                   const SpectralRadiusOptions& estimate,
                                                   const std::vector<int64_t>& rows) {
  // One map (for an energy model, one Prepare of the block's context) for
  // both: the estimate differentiates only with respect to its own leaf, so
  // its directions are a fixed input of the penalty.
  const CellFn whole = FixedPointMap(u);
  const Tensor& z_star = FixedPoint();
  if (rows.empty()) {
    const Tensor directions = EstimateSpectralRadius(whole, z_star, estimate).directions;
    return SpectralRadiusPenalty(whole, z_star, directions, target);
  }
  // In batch order: the maps take a full set of ids to be the batch itself.
  std::vector<int64_t> sorted = rows;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    SP_CHECK(sorted[i] >= 0 && sorted[i] < z_star.dim(0), "SequenceModel: penalty row ",
             sorted[i], " is outside the batch of ", z_star.dim(0));
    SP_CHECK(i == 0 || sorted[i] != sorted[i - 1], "SequenceModel: penalty row ", sorted[i],
             " is named twice");
  }
  // The rows' own map: its sample i is the batch's sample sorted[i].
  const CellFn map = [whole, rows = sorted](const Var& z, const std::vector<int64_t>& ids) {
    std::vector<int64_t> batch_ids;
    batch_ids.reserve(ids.size());
    for (int64_t id : ids) batch_ids.push_back(rows[static_cast<std::size_t>(id)]);
    return whole(z, batch_ids);
  };
  // A plain copy: z* is no leaf of any tape, so the gather records nothing.
  const Tensor z_rows = gather(Var(z_star), 0, sorted).value();
  const Tensor directions = EstimateSpectralRadius(map, z_rows, estimate).directions;
  return SpectralRadiusPenalty(map, z_rows, directions, target);
}

SpectralRadiusResult SequenceModel::FixedPointSpectralRadius(
    const Var& u, const SpectralRadiusOptions& estimate) const {
  return EstimateSpectralRadius(FixedPointMap(u), FixedPoint(), estimate);
}

Var SequenceModel::AttentionSpectralRadiusPenalty(double target,
                                                  const SpectralRadiusOptions& estimate) const {
  SP_CHECK(options_.keep_attention_inputs,
           "SequenceModel: the attention spectral-radius penalty needs "
           "ModelOptions::keep_attention_inputs");
  Var total;
  for (const auto& [name, attention] : FindEnergyAttentions(*this)) {
    const Var penalty = attention->SpectralRadiusPenalty(target, estimate);
    total = total.defined() ? add(total, penalty) : penalty;
  }
  return total.defined() ? total : Var(Tensor::Scalar(0.0, options_.dtype));
}

Var SequenceModel::FixedPointCorrectionLoss(const Var& u,
                                            const std::function<Var(const Var& logits)>& task_loss,
                                            const FixedPointCorrectionOptions& options) {
  SP_CHECK(options_.kind == ModelKind::kImplicit && implicit_ != nullptr && !cells_.empty(),
           "SequenceModel: the fixed-point correction loss needs an implicit model");
  const std::vector<Tensor>& iterates = implicit_->last_result().sampled_iterates;
  SP_CHECK(!iterates.empty(), "SequenceModel: the fixed-point correction loss needs forward "
                              "iterates (implicit.sampled_iterates > 0) and a Forward first");
  return stillpoint::FixedPointCorrectionLoss(
      FixedPointMap(u), iterates, [&](const Var& z) { return task_loss(Head(z)); }, options);
}

Var SequenceModel::Encode(const std::vector<int64_t>& ids, const Shape& ids_shape) {
  return EncodeInjection(Embed(ids, ids_shape));
}

std::vector<std::pair<std::string, AttentionDiagnostics>> SequenceModel::DiagnoseAttention(
    const Var& u) {
  NoGrad no_grad;
  std::vector<std::pair<std::string, AttentionDiagnostics>> result;
  if (options_.kind == ModelKind::kEnergy) {
    result.emplace_back("block", DiagnoseEnergyBlock(*energy_block_, options_.implicit, u));
    return result;
  }
  const auto attentions = FindEnergyAttentions(*this);
  if (attentions.empty()) return result;
  for (const auto& [name, attention] : attentions) attention->KeepInputs(true);
  EncodeInjection(u);
  for (const auto& [name, attention] : attentions) {
    attention->KeepInputs(options_.keep_attention_inputs);
    result.emplace_back(name, attention->Diagnose(Var(attention->last_input())));
  }
  return result;
}

Var SequenceModel::EncodeInjection(const Var& u) {
  // What the attention penalty reads is kept from this pass on.
  if (options_.keep_attention_inputs) {
    for (const auto& [name, attention] : FindEnergyAttentions(*this)) attention->ForgetKeptInputs();
  }
  if (options_.kind == ModelKind::kEnergy) {
    const EnergyBlockProblemPtr problem = energy_block_->Prepare(u);
    Var start = problem->initial_state;
    if (is_training() && options_.solver_init != SolverInit::kZeros && depth_override_ == 0) {
      start = add(start, constant(RandomStart(start.shape(), options_.solver_init, init_rng_)));
    }
    const Var state = depth_override_ > 0 ? UnrollUpdates(*problem->energy, problem->initial_state,
                                                          static_cast<int>(depth_override_))
                                          : implicit_->Forward(problem->energy, start);
    const Var h = energy_block_->Readout(state, *problem);
    return add(h, ffn_->Forward(ffn_norm_->Forward(h)));
  }
  // input_injection first_step (explicit, tied): z0 = u, cells get zeros.
  const bool first_step = options_.input_injection == InputInjection::kFirstStep &&
                          (options_.kind == ModelKind::kExplicit ||
                           options_.kind == ModelKind::kTied);
  const Var no_injection = first_step ? zeros_like(u) : Var();
  const bool unroll = options_.kind == ModelKind::kTied ||
                      (options_.kind == ModelKind::kImplicit && depth_override_ > 0);
  if (unroll) {
    // One map for all k steps, as in the implicit model.
    ReleaseDropoutMasks(*cells_[0]);
    FreezeDropoutMasks(*cells_[0]);
    const int64_t steps = depth_override_ > 0 ? depth_override_ : options_.unroll_steps;
    if (first_step) {
      Var z = u;
      for (int64_t k = 0; k < steps; ++k) z = cells_[0]->Forward(z, no_injection, {});
      return z;
    }
    Var z = cells_[0]->ForwardAtZero(u, {});
    for (int64_t k = 1; k < steps; ++k) z = cells_[0]->Forward(z, u, {});
    return z;
  }
  switch (options_.kind) {
    case ModelKind::kExplicit: {
      if (first_step) {
        Var z = u;
        for (const auto& cell : cells_) z = cell->Forward(z, no_injection, {});
        return z;
      }
      // z0 = 0: the first cell starts from the zero state.
      Var z = cells_[0]->ForwardAtZero(u, {});
      for (std::size_t k = 1; k < cells_.size(); ++k) z = cells_[k]->Forward(z, u, {});
      return z;
    }
    case ModelKind::kTied:  // handled above
      break;
    case ModelKind::kImplicit:
      if (next_initial_state_.defined()) {
        const Tensor z0 = std::move(next_initial_state_);
        next_initial_state_ = Tensor();
        SP_CHECK(z0.shape() == u.shape(), "SequenceModel: the initial state's shape ",
                 z0.shape().ToString(), " differs from the injection's ", u.shape().ToString());
        return implicit_->Forward(u, z0);
      }
      if (is_training() && options_.solver_init != SolverInit::kZeros) {
        return implicit_->Forward(u, RandomStart(u.shape(), options_.solver_init, init_rng_));
      }
      return implicit_->Forward(u);
    case ModelKind::kEnergy:  // handled above
      break;
  }
  return Var();
}

void SequenceModel::SetNextInitialState(Tensor z0) {
  SP_CHECK(!z0.defined() || options_.kind == ModelKind::kImplicit,
           "SetNextInitialState: only an implicit model starts a solve from a given state");
  next_initial_state_ = std::move(z0);
}

Tensor SequenceModel::RandomStart(const Shape& shape, SolverInit init, Rng& rng) const {
  Tensor start = RandomNormal(shape, 0.0, 1.0, options_.dtype, rng);
  if (init == SolverInit::kMixed) {
    for (int64_t i = 0; i < start.numel(); ++i) {
      if (rng.Uniform() < 0.5) start.set(i, 0.0);
    }
  }
  return start;
}

PathIndependence SequenceModel::ComparePaths(const Var& u, Rng& rng) {
  SP_CHECK(implicit_ != nullptr, "SequenceModel: the path-independence score needs a model that "
                                 "solves (implicit or energy), not ",
           stillpoint::ToString(options_.kind));
  NoGrad no_grad;
  if (options_.kind == ModelKind::kEnergy) {
    const EnergyBlockProblemPtr problem = energy_block_->Prepare(u);
    const Tensor noise = RandomStart(problem->initial_state.shape(), SolverInit::kRandom, rng);
    const Var from_start = implicit_->Forward(problem->energy, problem->initial_state);
    const Var from_random =
        implicit_->Forward(problem->energy, add(problem->initial_state, constant(noise)));
    auto logits = [&](const Var& state) {
      const Var h = energy_block_->Readout(state, *problem);
      return Head(add(h, ffn_->Forward(ffn_norm_->Forward(h)))).value();
    };
    return ScorePathIndependence(from_start.value(), from_random.value(), logits(from_start),
                                 logits(from_random));
  }
  const Var from_zeros = implicit_->Forward(u);
  const Var from_random =
      implicit_->Forward(u, RandomStart(u.shape(), SolverInit::kRandom, rng));
  return ScorePathIndependence(from_zeros.value(), from_random.value(), Head(from_zeros).value(),
                               Head(from_random).value());
}

Var SequenceModel::ProgressiveLogits(const Var& u, int64_t n, int64_t k) {
  SP_CHECK((options_.kind == ModelKind::kTied || options_.kind == ModelKind::kImplicit) &&
               !cells_.empty(),
           "SequenceModel: the progressive loss needs a tied or implicit model, not ",
           stillpoint::ToString(options_.kind));
  SP_CHECK(n >= 0 && k >= 1, "SequenceModel: progressive loss steps n >= 0 and k >= 1, got n ", n,
           ", k ", k);
  const Cell& cell = *cells_[0];
  // input_injection first_step (tied): the unroll starts at u and the cell
  // gets no injection, as in EncodeInjection.
  const bool first_step = options_.kind == ModelKind::kTied &&
                          options_.input_injection == InputInjection::kFirstStep;
  const Var injection = first_step ? zeros_like(u) : u;
  Var z = first_step ? u : constant(Tensor::Zeros(u.shape(), u.dtype()));
  if (n > 0) {
    NoGrad no_grad;
    const Var fixed_injection = constant(injection.value());
    Var detached = constant(z.value());
    for (int64_t step = 0; step < n; ++step) detached = cell.Forward(detached, fixed_injection, {});
    z = constant(detached.value());
  }
  for (int64_t step = 0; step < k; ++step) z = cell.Forward(z, injection, {});
  return Head(z);
}

Var SequenceModel::Head(Var z) const {
  if (lookup_) z = add(z, lookup_->Forward(z));
  if (hopfield_pooling_) {
    z = mean(hopfield_pooling_->Forward(z), 1);  // [B, patterns, d] -> [B, d]
  } else if (pool_) {
    z = mean(z, 1);  // [B, T, d] -> [B, d]
  }
  return out_->Forward(lnf_->Forward(z));
}

Var SequenceModel::Forward(const std::vector<int64_t>& ids, const Shape& ids_shape) {
  return Head(Encode(ids, ids_shape));
}

Var SequenceModel::ForwardFeatures(const Var& features) {
  return Head(EncodeInjection(EmbedFeatures(features)));
}

SequenceClassifier::SequenceClassifier(const ModelOptions& options)
    : SequenceModel(options, options.num_classes, /*pool=*/true) {}

std::string SequenceClassifier::Name() const {
  std::ostringstream out;
  out << "SequenceClassifier(" << stillpoint::ToString(options().kind) << ", " << options().cell
      << ", " << options().num_classes << " classes, dim " << options().dim << ")";
  return out.str();
}

}  // namespace stillpoint
