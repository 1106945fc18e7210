// Transformer models over token sequences, in four kinds that share the
// embedding and the head, so that they can be compared like for like
// (bench/SPEC.md W1):
//
//   u = E[x] + P[t]                          injection, [B, T, d]
//                                            (P: positions learned only;
//                                            the other schemes of
//                                            positions.h act in attention)
//   explicit: z_0 = 0, z_l = f_l(z_{l-1}; u) for l = 1..L, L untied cells
//             (input_injection first_step: z_0 = u, z_l = f_l(z_{l-1}; 0))
//   tied:     z_0 = 0, z_k = f(z_{k-1}; u) for k steps of ONE cell, trained by
//             backprop through the k steps
//   implicit: z* = f(z*; u) solved from z_0 = 0 by Implicit (implicit_layer.h),
//             gradients by options.implicit.backward (IFT by default)
//   energy:   an energy attention block (energy_block.h, options.energy)
//             prepares its energy from u, Implicit solves the energy
//             layer's update to its fixed point (options.implicit), the
//             block reads out h = Readout(z*) [B, T, d], and an explicit
//             feed-forward sublayer follows: z = h + MLP(LN(h))
//   logits = LNf(z) Wout + bout               SequenceModel: [B, T, V]
//   logits = LNf(mean_t z) Wout + bout        SequenceClassifier: [B, C]
//
// The cell is any cell registered in CellRegistry() (registry.h), by
// default "deq_transformer" (DEQCell), whose attention sublayer is
// cell_options.attention: softmax, or any energy block of
// EnergyBlockRegistry() solved to its fixed point inside the cell (nested
// in the outer solve of an implicit model). The energy kind has no cell: its
// block is cell_options.attention when that names an energy block, else
// energy.layer. Token ids are
// [B, T] with T <= max_length and values in [0, vocab_size).
//
// Parameter names (those of the reference implementation):
//   tok_emb [V, d], pos_emb [max_length, d] (positions learned), lnf.gain, lnf.bias [d],
//   out.weight [d, V or C], out.bias [V or C], then
//   cell.* (tied, implicit) or cells.<l>.* (explicit), in this order;
//   energy: block.* (the energy layer as block.layer.*), ffn_ln.gain,
//   ffn_ln.bias [d], ffn.fc1.*, ffn.fc2.* (hidden width
//   cell_options.hidden) instead of the cells.
//
// Dropout (cell_options.dropout > 0): the tied model freezes the cell's masks
// for all k steps of a Forward (the same map at every step, as in the
// implicit model); the explicit model draws per layer as usual.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "layers/cell.h"
#include "layers/embedding.h"
#include "layers/energy_attention.h"
#include "layers/energy_block.h"
#include "layers/hopfield.h"
#include "layers/implicit_layer.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/mlp.h"
#include "layers/positions.h"
#include "solvers/implicit_solve.h"
#include "solvers/regularizers.h"

namespace stillpoint {

// Where the forward solve of an implicit or energy model starts while the
// model trains (model.solver.init). Evaluation always starts from zeros (or
// the energy block's start).
enum class SolverInit {
  kZeros,   // "zeros": z0 = 0 (energy: the block's start)
  kRandom,  // "random": z0 ~ N(0, 1) per entry (energy: the start plus it)
  kMixed    // "mixed": N(0, 1) with each entry zeroed with probability 1/2
            // (TorchDEQ's mixed initialisation)
};
const char* ToString(SolverInit init);

// The agreement of the fixed points one input reaches from two starts (Anil
// et al.'s asymptotic alignment): cosine is the mean over samples of
// cos(z*_a, z*_b) (each sample's whole state; 1 when both are zero, 0 when
// only one is), agreement the fraction of predictions (argmax over the last
// axis of the logits, every row) that match. NaN when nothing was compared.
struct PathIndependence {
  double cosine = std::numeric_limits<double>::quiet_NaN();
  double agreement = std::numeric_limits<double>::quiet_NaN();
};
// z_a, z_b [B, ...] (same shape), logits_a, logits_b [..., C] (same shape).
PathIndependence ScorePathIndependence(const Tensor& z_a, const Tensor& z_b,
                                       const Tensor& logits_a, const Tensor& logits_b);

// Where the injection u enters (model.input_injection).
enum class InputInjection {
  kEveryStep,  // "every_step": every cell application gets u (the DEQ's
               // f(z; u), Bansal et al.'s recall); z0 = 0. Every kind.
  kFirstStep   // "first_step": z0 = u and the cells get no injection (a
               // plain transformer stack); explicit and tied only (an
               // implicit model's fixed point would forget its input).
};
const char* ToString(InputInjection injection);

// The model kinds, one line each: X(value, "name", "doc"); the enum, the
// names of model.kind (with did-you-mean), its doc and the kinds of
// `stillpoint compare` are made from it. A new kind goes at the end.
#define SP_MODEL_KINDS(X)                                                                    \
  X(kExplicit, "explicit", "num_layers untied cells")                                        \
  X(kTied, "tied", "one cell unrolled unroll_steps times with backprop")                     \
  X(kImplicit, "implicit", "the cell solved to its fixed point")                             \
  X(kEnergy, "energy",                                                                       \
    "an energy attention block (model.energy.*) solved to its fixed point, then a "          \
    "feed-forward sublayer")

#define SP_MODEL_KIND_ENUMERATOR(value, name, doc) value,
enum class ModelKind { SP_MODEL_KINDS(SP_MODEL_KIND_ENUMERATOR) };
#undef SP_MODEL_KIND_ENUMERATOR

const char* ToString(ModelKind kind);
// Accepts the ToString spelling in any letter case; false otherwise.
bool StringToModelKind(const std::string& text, ModelKind* kind);
const std::vector<ModelKind>& AllModelKinds();
// The names of AllModelKinds(), in list order.
std::vector<std::string> ModelKindNames();
// "name: doc; name: doc; ..." of every kind (model.kind's doc).
std::string ModelKindsDoc();

struct ModelOptions {
  ModelKind kind = ModelKind::kImplicit;
  int64_t vocab_size = 16;
  // > 0: the inputs are feature vectors [B, T, feature_dim] (e.g. image
  // patches), embedded by a learned linear map "feat_emb" instead of the
  // token table (ForwardFeatures); 0: token ids (Forward).
  int64_t feature_dim = 0;
  // Longest sequence (rows of the positional table; positions learned only).
  int64_t max_length = 32;
  // How attention sees token order (positions.h): the position scheme
  // (learned: the table above, added to the injection; every other scheme:
  // no table, any length), the attention mask and
  // its window. Every attention of the model, softmax or energy, uses them.
  PositionScheme positions = PositionScheme::kLearned;
  AttentionMaskKind attention_mask = AttentionMaskKind::kNone;
  int64_t attention_window = 0;
  // Model width d. Overrides cell_options.dim.
  int64_t dim = 64;
  // Output classes: SequenceClassifier's C (> 0); for SequenceModel the
  // classes of every token's target (0: vocab_size, when the targets are
  // tokens themselves).
  int64_t num_classes = 0;
  // The cell, by registry name, and its options (dim and dtype are set from
  // this struct's dim and dtype).
  std::string cell = "deq_transformer";
  CellOptions cell_options;
  // kExplicit: number of untied cells L.
  int64_t num_layers = 6;
  // kTied: number of applications k of the one cell.
  int64_t unroll_steps = 6;
  // kImplicit and kEnergy: forward solver and backward mode.
  ImplicitOptions implicit;
  // kImplicit and kEnergy: the start of every training solve
  // (model.solver.init), drawn from a stream seeded by seed.
  SolverInit solver_init = SolverInit::kZeros;
  // explicit and tied: where u enters (implicit and energy models need it
  // at every step).
  InputInjection input_injection = InputInjection::kEveryStep;
  // kEnergy: the energy block (dim, dtype and causal are set from this
  // struct's dim, dtype and cell_options.causal).
  EnergyBlockOptions energy;
  // Standard deviation of the token and position tables' initialisation.
  double embedding_init_std = 1.0;
  // Epsilon of the final layer norm lnf.
  double head_ln_eps = 1e-5;
  DType dtype = DType::kFloat32;
  // Seed of every parameter initialisation (drawn in parameter order).
  uint64_t seed = 0;
  // SequenceClassifier: how the token states [B, T, d] become one vector
  // before the head. "mean" (over tokens) or "hopfield": HopfieldPooling
  // (hopfield.h), pooling_patterns learned state patterns retrieve from the
  // states, solved to the fixed point of the Hopfield energy with the
  // patterns as an external field (so they learn through the implicit
  // gradient); the patterns' outputs are averaged. Parameters "pool.*".
  std::string pooling = "mean";
  int64_t pooling_patterns = 4;
  // An associative memory read after the encoder, in every kind: "none" or
  // "hopfield": z <- z + HopfieldLookup(z) (hopfield.h), each token state
  // queries lookup_size learned stored patterns and reads their learned
  // targets at the fixed point of the Hopfield energy, the token as an
  // external field (so the lookup stays a function of the token and the
  // encoder learns through it). Parameters "lookup.*".
  std::string lookup = "none";
  int64_t lookup_size = 64;
  // Every energy attention of the cells keeps its last input and inner
  // solution (EnergyAttention::KeepInputs), which AttentionSpectralRadius-
  // Penalty reads. A setting for code only (a config's
  // model.regularization.attention_spectral_radius_weight turns it on).
  bool keep_attention_inputs = false;

  // The model.* keys (framework/option_fields.h), the cell's
  // (cell_options: attention, heads, hidden, dropout, ln_eps) and the energy
  // block's (model.energy.*) among them; implicit is read from
  // model.solver.* (ImplicitOptions), vocab_size, feature_dim, num_classes
  // and head_ln_eps are settings for code only (a config's task and
  // model.ln_eps set them).
  static const OptionFields<ModelOptions>& Fields();
  // The fields' ranges, and implicit for the kinds that solve (implicit,
  // energy). The model's constructors check it; the cells (a user's cell
  // need not have heads), the energy block and the cells' energy attentions
  // check their own options where they are built.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

// What every model offers a trainer.
class Model : public Module {
 public:
  // ids (ids_shape.numel() token ids, ids_shape [B, T]) -> logits.
  virtual Var Forward(const std::vector<int64_t>& ids, const Shape& ids_shape) = 0;
  // The implicit layer of an implicit model (for its solver summaries), else
  // null.
  virtual const Implicit* implicit() const { return nullptr; }
};

class SequenceModel : public Model {
 public:
  // Per-token logits over the vocabulary: [B, T, vocab_size].
  explicit SequenceModel(const ModelOptions& options);

  std::string Name() const override;

  Var Forward(const std::vector<int64_t>& ids, const Shape& ids_shape) override;
  // Feature inputs [B, T, feature_dim] -> logits (options.feature_dim > 0).
  Var ForwardFeatures(const Var& features);
  // The injection u = E[x] + P[t]: [B, T, d].
  Var Embed(const std::vector<int64_t>& ids, const Shape& ids_shape) const;
  // The injection for feature inputs: u = features W_f + b_f + P[t].
  Var EmbedFeatures(const Var& features) const;
  // Incremental decoding (training/generate_step.h): the injection of the
  // tokens `ids` at positions first, first + 1, ... (rows first.. of
  // Embed's result for a longer sequence): [1, ids.size(), d].
  Var EmbedFrom(const std::vector<int64_t>& ids, int64_t first) const;
  // The head (lookup, final norm, output layer) on final states z [B, T, d]
  // -> logits [B, T, V]: what Forward applies after Encode.
  Var Logits(const Var& z) const { return Head(z); }
  // The final states before the head: [B, T, d].
  Var Encode(const std::vector<int64_t>& ids, const Shape& ids_shape);

  // The collapse diagnostics (energy_attention.h) of every energy attention
  // of the model for the injection u [B, T, d], off the tape: each cell's
  // attention at the input it last saw while encoding u (named by its
  // module path, e.g. "cells.0.attention"), or the energy kind's block at u
  // ("block"). Empty for a model with softmax attention.
  std::vector<std::pair<std::string, AttentionDiagnostics>> DiagnoseAttention(const Var& u);

  // Depth override (0 = off). For an implicit model, steps > 0 replaces the
  // solve by the tied unroll of the same cell for that many steps (trained by
  // backprop: the pretraining phase of DEQ training); for an energy model,
  // by that many of the energy layer's updates from the block's initial
  // state (UnrollUpdates, backprop through them); for a tied model it sets
  // the number of unrolled steps (test-time depth). Explicit models ignore
  // it.
  void SetDepthOverride(int64_t steps);

  // The columns of the grid the input tokens form (DatasetInfo::grid_width;
  // 0: a sequence), for the 2-D position schemes and the local mask
  // (positions.h). Set before a Forward on grid data; every attention of the
  // model reads it.
  void SetGridWidth(int64_t grid_width);
  const AttentionLayout& layout() const { return *layout_; }
  int64_t depth_override() const { return depth_override_; }

  // The path-independence score (ScorePathIndependence) of the model's
  // solve for injection u: the fixed points (and predictions) reached from
  // zeros and from z0 ~ N(0, 1) drawn from rng (energy kind: the block's
  // start and that start plus the noise), off the tape. Implicit and energy
  // kinds; throws for others.
  PathIndependence ComparePaths(const Var& u, Rng& rng);

  // The logits after n steps of the cell from z0 = 0 run off the tape, then
  // k steps with gradients (Bansal et al.'s progressive loss: the first n
  // are detached). Tied and implicit kinds; throws for others.
  Var ProgressiveLogits(const Var& u, int64_t n, int64_t k);

  // The map z -> f(z; u) whose fixed point the model's own solve finds, for
  // regularisers and diagnostics at that point (solvers/implicit_solve.h CellFn:
  // the rows `ids` of u for a subset of samples): the cell for an implicit
  // model, the energy block's update (with the block's context prepared
  // from u, on the tape) for an energy model. Throws for other kinds.
  CellFn FixedPointMap(const Var& u) const;
  // The fixed point of the last Forward's own solve (implicit and energy
  // kinds). Throws before a Forward or for other kinds.
  const Tensor& FixedPoint() const;
  // The initial state of the next Forward's solve (implicit kind; [B, T, d]
  // of that Forward), used once; an empty tensor clears it. Generation
  // starts each solve from the previous position's fixed point this way.
  void SetNextInitialState(Tensor z0);

  // Regularisers at the fixed point of the last Forward, for the injection
  // u that Forward saw (Embed / EmbedFeatures of the same inputs), each
  // differentiable w.r.t. the map's parameters and u (solvers/
  // regularizers.h); implicit and energy kinds:
  // - the Hutchinson estimate of ||J_f(z*)||_F^2 / numel with `probes`
  //   probes drawn from rng;
  Var FixedPointJacobianPenalty(const Var& u, int probes, Rng& rng);
  // - the mean over samples of max(0, rho_b - target)^2, rho_b the
  //   power-iteration estimate of the spectral radius of J_f(z*) (its
  //   directions found with the tape off, then held fixed); over the
  //   samples `rows` of the batch only when given, at their share of the
  //   memory (drawn at random they estimate the whole batch's mean without
  //   bias; training/step_regularizers.h chooses them).
  Var FixedPointSpectralRadiusPenalty(const Var& u, double target,
                                      const SpectralRadiusOptions& estimate,
                                      const std::vector<int64_t>& rows = {});
  // - the sum over the cells' energy attentions of each one's spectral-
  //   radius penalty at the inner fixed points of the last Forward
  //   (EnergyAttention::SpectralRadiusPenalty; needs
  //   options.keep_attention_inputs and a Forward first); 0 without energy
  //   attention.
  Var AttentionSpectralRadiusPenalty(double target, const SpectralRadiusOptions& estimate) const;
  // The power-iteration estimate itself (a diagnostic, not differentiable).
  SpectralRadiusResult FixedPointSpectralRadius(const Var& u,
                                                const SpectralRadiusOptions& estimate = {}) const;

  // The fixed-point correction loss (solvers/regularizers.h) of the
  // implicit model's last Forward for the injection u it saw: task_loss
  // (given the logits of Head) applied to the forward iterates its solve
  // kept (options.implicit.sampled_iterates > 0), each after
  // options.steps recorded damped steps of the cell, weighted towards the
  // last. Differentiable w.r.t. the cell's, the head's parameters and u.
  // Throws for a model that is not implicit or whose last solve kept no
  // iterates.
  Var FixedPointCorrectionLoss(const Var& u, const std::function<Var(const Var& logits)>& task_loss,
                               const FixedPointCorrectionOptions& options);

  const Implicit* implicit() const override { return implicit_.get(); }
  Implicit* mutable_implicit() { return implicit_.get(); }
  const ModelOptions& options() const { return options_; }
  // The cells: one for tied and implicit models, num_layers for explicit,
  // none for energy models.
  int64_t num_cells() const { return static_cast<int64_t>(cells_.size()); }
  const std::shared_ptr<Cell>& cell(int64_t index) const;
  // The energy block (energy models; else null).
  const std::shared_ptr<EnergyBlock>& energy_block() const { return energy_block_; }
  // The Hopfield layers of the pooling and the lookup (options.pooling,
  // options.lookup) that are in use, by module path ("pool.hopfield",
  // "lookup.hopfield"); their last_solve() holds the inner solves of the
  // last Forward.
  std::vector<std::pair<std::string, std::shared_ptr<HopfieldAttention>>> HopfieldReadouts() const;

 protected:
  // out_features: V (per token) or C (pooled); pool: mean over tokens first.
  SequenceModel(const ModelOptions& options, int64_t out_features, bool pool);

 private:
  // The final states for injection u: [B, T, d].
  Var EncodeInjection(const Var& u);
  // embedded [B, T, d] + P[:T] with learned positions (T <= max_length),
  // else embedded.
  Var WithPositions(const Var& embedded) const;
  Var Head(Var z) const;

  // The start of a training solve of shape `like` (options.solver_init);
  // undefined for zeros.
  Tensor RandomStart(const Shape& shape, SolverInit init, Rng& rng) const;

  ModelOptions options_;
  bool pool_;
  // The starts of training solves (model.solver.init). Runtime state.
  Rng init_rng_;
  int64_t depth_override_ = 0;
  Tensor next_initial_state_;  // SetNextInitialState
  std::shared_ptr<Linear> feature_embedding_;  // feature_dim > 0 only
  // The tables are registered as this model's own "tok_emb" and "pos_emb".
  std::shared_ptr<TokenEmbedding> token_embedding_;
  std::shared_ptr<PositionalEmbedding> position_embedding_;  // positions learned only
  // Shared with every attention of the model (options.positions,
  // attention_mask, attention_window; the grid width set at run time).
  std::shared_ptr<AttentionLayout> layout_;
  std::shared_ptr<LayerNorm> lnf_;
  std::shared_ptr<Linear> out_;
  std::vector<std::shared_ptr<Cell>> cells_;
  std::shared_ptr<Implicit> implicit_;  // kImplicit and kEnergy
  // kEnergy only.
  std::shared_ptr<EnergyBlock> energy_block_;
  std::shared_ptr<LayerNorm> ffn_norm_;
  std::shared_ptr<MLP> ffn_;
  // options.pooling == "hopfield" / options.lookup == "hopfield".
  std::shared_ptr<HopfieldPooling> hopfield_pooling_;
  std::shared_ptr<HopfieldLookup> lookup_;
};

class SequenceClassifier : public SequenceModel {
 public:
  // Logits over options.num_classes classes for each sequence: [B, C].
  explicit SequenceClassifier(const ModelOptions& options);

  std::string Name() const override;
};

}  // namespace stillpoint
