// `stillpoint demo correction` and `stillpoint correct` (seed 004, Movellan
// & Gabbur; docs/seeds.md M1-M3): inference-time corrections of a trained
// probabilistic-attention model.
//
// Part 1, clamped-value belief propagation (eqs 31-38). The task: T =
// segments x segment_length positions, each segment has one hidden label
// in [0, classes); every position shows its segment's label with
// probability observation_accuracy, else another label at random, and
// must output its segment's label. Positions share information: a
// position's own token is weak evidence, its segment's tokens together are
// strong, and one known label decides a whole segment. The model (model.kind
// energy, energy.layer probabilistic, written to OUT/run by the ordinary
// trainer from OUT/data/*.csv) learns to pool each segment. At inference an
// annotator gives the labels of k positions (k = 0 .. T/2, one per segment
// in turn); a labelled position is clamped to the value the model gives it
// when it holds its label as its token (ClampedValues), and
// PropagateClampedValues re-estimates the key units' value means (prior
// precision value_prior_precision around the trained ones) before
// value inference. Reported: the accuracy of the positions not clamped.
//
// Part 2, online key adaptation (eqs 22-30). A prototype classifier: the
// digits images are the queries (one query unit per image, a batch of
// adaptation_batch images at a time) and a learned set of prototypes gives
// the keys and values of a probabilistic attention with Gaussian (RBF)
// logits, no magnitude priors; a linear head reads the value. It is
// trained on clean digits, then tested on digits with shift_offset added to
// every pixel (in units of the maximum intensity): the queries move off the
// keys. AdaptKeys (MAP-EM on the keys, prior precision key_prior_precision
// around the trained keys) moves the keys to the shifted queries of each
// test batch. Reported: the shifted accuracy without and with adaptation
// (and the clean accuracy with both, as a control).
//
// Writes clamping.csv, clamping.svg, key_adaptation.csv, key_adaptation.svg,
// summary.json (accuracy_unclamped_before / _after: 0 and T/2 clamped
// positions; shift_accuracy_before / _after: no adaptation and adaptation)
// and the run directory OUT/run, which `stillpoint correct` can read.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "framework/tensor.h"
#include "layers/models.h"
#include "layers/probabilistic_attention.h"
#include "training/data/dataset.h"

namespace stillpoint {

struct CorrectionDemoOptions {
  std::string out_dir;
  bool overwrite = false;  // write into an out_dir that holds files
  // Part 1: the segment task.
  int64_t segments = 4;
  int64_t segment_length = 4;
  int64_t classes = 4;
  double observation_accuracy = 0.4;  // in (1/classes, 1)
  int64_t train_examples = 4096;  // generated sequences
  int64_t test_examples = 512;
  int64_t train_steps = 500;
  // Belief propagation: EM iterations and the value-prior precision
  // lambda_mu (> 0; it competes with beta_j times the clamped units'
  // responsibilities, eq 35).
  int belief_iterations = 3;
  double value_prior_precision = 0.01;
  // Part 2: prototype classifier on digits.
  int64_t prototypes = 30;
  int64_t prototype_steps = 400;
  int64_t adaptation_batch = 64;
  double shift_offset = 0.3;
  int adaptation_iterations = 10;
  double key_prior_precision = 1.0;
  uint64_t seed = 0;
};

struct CorrectionDemoResult {
  double accuracy_unclamped_before = 0.0, accuracy_unclamped_after = 0.0;
  double shift_accuracy_before = 0.0, shift_accuracy_after = 0.0;
  double clean_accuracy_before = 0.0, clean_accuracy_after = 0.0;
};

void CheckCorrectionDemoOptions(const CorrectionDemoOptions& options);
CorrectionDemoResult RunCorrectionDemo(const CorrectionDemoOptions& options, std::ostream& out);

// ---- clamped-value belief propagation on a trained run

// The probabilistic attention of a model of kind energy with energy.layer
// probabilistic; throws an Error naming the run and what its model is
// otherwise.
const ProbabilisticAttention& RequireProbabilisticAttention(const SequenceModel& model,
                                                            const std::string& run);

// The clamped values [B, T, H dv] for clamp_labels [B * T] (-1 = free):
// at a clamped position, the value the model gives that position when it
// holds the token clamp_labels names (the label is a token of the
// vocabulary); zeros elsewhere.
Tensor ClampedValues(SequenceModel& model,
                     const std::vector<int64_t>& ids,
                     const Shape& shape,
                     const std::vector<int64_t>& clamp_labels);

// Logits [B, T, classes] of the batch with the positions where clamp_labels
// is >= 0 clamped (ClampedValues) and clamped-value belief propagation run
// before value inference. With no clamped position: the plain forward.
Tensor LogitsWithClamps(SequenceModel& model,
                        const std::vector<int64_t>& ids,
                        const Shape& shape,
                        const std::vector<int64_t>& clamp_labels,
                        const ValueBeliefOptions& options);

struct CorrectArgs {
  std::string run;
  std::string input;                // token ids, separated by spaces or commas
  std::vector<std::string> clamps;  // POS=VALUE
  int iterations = 3;
  double value_prior_precision = 0.01;
};
// Throws an Error for bad input (named), then prints the predictions.
void RunCorrect(const CorrectArgs& args, std::ostream& out);

}  // namespace stillpoint
