// Embeddings: learned tables looked up by integer id.
//
// TokenEmbedding maps token ids to rows of E [vocab_size, dim]:
//   ids (any shape S, values in [0, vocab_size)) -> S + [dim].
// PositionalEmbedding holds P [max_length, dim] and adds P[t] to the token
// at position t of x [B, T, dim] (T <= max_length): the injection of a
// sequence model is u = E[x] + P[t].
//
// Parameters: "weight" in both (the models register these tables under
// their own names, "tok_emb" and "pos_emb"). Initialisation: N(0, init_std^2),
// default init_std = 1 (PyTorch's nn.Embedding), so the injection has the
// unit scale of the layer-normalised state it is added to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/autograd.h"
#include "framework/module.h"
#include "framework/option_fields.h"
#include "framework/random.h"
#include "framework/tensor.h"

namespace stillpoint {

struct EmbeddingOptions {
  // Standard deviation of the normal initialisation.
  double init_std = 1.0;
  DType dtype = DType::kFloat32;

  // The fields, declared once (framework/option_fields.h); not config keys.
  static const OptionFields<EmbeddingOptions>& Fields();
  // The fields' ranges: init_std >= 0.
  bool IsValid(std::string* error) const;
  std::string ToString() const;
};

class TokenEmbedding : public Module {
 public:
  TokenEmbedding(int64_t vocab_size, int64_t dim, Rng& rng, const EmbeddingOptions& options = {});

  std::string Name() const override;

  // ids: ids_shape.numel() ids in [0, vocab_size) -> ids_shape + [dim].
  // An id out of range is an Error naming it and its position.
  Var Forward(const std::vector<int64_t>& ids, const Shape& ids_shape) const;

  int64_t vocab_size() const { return vocab_size_; }
  int64_t dim() const { return dim_; }
  const Var& weight() const { return weight_; }

 private:
  int64_t vocab_size_;
  int64_t dim_;
  Var weight_;
};

class PositionalEmbedding : public Module {
 public:
  PositionalEmbedding(int64_t max_length,
                      int64_t dim,
                      Rng& rng,
                      const EmbeddingOptions& options = {});

  std::string Name() const override;

  // The first `length` rows of P: [length, dim] (length <= max_length).
  Var Positions(int64_t length) const;
  // x [B, T, dim] -> x + P[:T] (broadcast over B).
  Var Forward(const Var& x) const;

  int64_t max_length() const { return max_length_; }
  int64_t dim() const { return dim_; }
  const Var& weight() const { return weight_; }

 private:
  int64_t max_length_;
  int64_t dim_;
  Var weight_;
};

}  // namespace stillpoint
