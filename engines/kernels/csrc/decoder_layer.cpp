// One decoder layer of a Llama-family model in one call (torch.classes.dpgate.DecoderLayer).
//
// Why: at a decode step the layer's matmuls are small, and the ~27 torch operators a layer runs
// in Python cost about as much as they do (argument parsing, dispatch, a tensor per result).
// Here the same kernels run in the same order on the same float32 values, so the result has the
// bits of engines/model/llama.py's (and gemma3.py's) forward over the kernel modules:
//   x = norm_in(h); qkv = x @ Wqkv; q, k = rotary(qk_norm(q, k)); cache[slots] = k, v
//   a = attention(q); o = post_attention_norm?(a @ Wo); h = h + o
//   x = norm_mlp(h); m = act(x @ Wgate) * (x @ Wup); d = post_mlp_norm?(m @ Wdown); h = h + d
// The rotary step is torch's x * cos + roll(x, D / 2) * signed_sin, each product and the sum
// rounded once (the build forbids contraction), and the residual adds are float32 adds, as torch's.
// Intermediate buffers are one workspace per calling thread, grown to the widest step and reused.
#include <ATen/ops/empty.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "dispatch.h"
#include "linear_weights.h"

namespace dpgate {
namespace {

void check_vector(const std::optional<at::Tensor>& t, int64_t size, const char* what) {
  if (!t.has_value()) return;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == size, "dpgate DecoderLayer: ",
              what, " must be float32 [", size, "]");
}

void check_linear(const c10::intrusive_ptr<LinearWeights>& w, int64_t in, int64_t out, const char* what) {
  TORCH_CHECK(w->in_features() == in && w->out_features() == out, "dpgate DecoderLayer: ", what, " is ",
              w->out_features(), "x", w->in_features(), ", the layer needs ", out, "x", in);
}

// rows [n, D] in place: x * cos + roll(x, D / 2) * signed_sin, with the tables of `row_table[r]`.
void rotate(float* rows, int64_t n, int64_t heads, int64_t D, const float* cos, const float* signed_sin) {
  std::vector<float> x(D);
  const int64_t half = D / 2;
  for (int64_t r = 0; r < n; ++r) {
    float* row = rows + r * D;
    const float* c = cos + (r / heads) * D;
    const float* s = signed_sin + (r / heads) * D;
    std::memcpy(x.data(), row, sizeof(float) * D);
    for (int64_t i = 0; i < D; ++i) {
      const float product = x[i] * c[i];
      const float rolled = x[i < half ? i + half : i - half] * s[i];
      row[i] = product + rolled;
    }
  }
}

void add_into(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Where the layer's time goes, for bench/step_split.py: CPU seconds of the calling thread per
// phase, summed over calls while enabled (with one torch thread that is all of the work).
enum Phase { kMatmul, kAttention, kNorms, kOther, kWhole, kPhases };
std::atomic<bool> clock_enabled{false};
thread_local double phase_seconds[kPhases] = {};

double thread_seconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec);
}

// Adds the time from its construction (or the last `next`) to a phase; free when disabled.
class PhaseTimer {
 public:
  PhaseTimer() : on_(clock_enabled.load(std::memory_order_relaxed)), last_(on_ ? thread_seconds() : 0.0) {}
  void next(Phase phase) {
    if (!on_) return;
    const double now = thread_seconds();
    phase_seconds[phase] += now - last_;
    last_ = now;
  }

 private:
  bool on_;
  double last_;
};

// The step's intermediates, reused across layers and steps by the thread that runs them.
struct Workspace {
  std::vector<float> normed, qkv, q, k, attended, projected, gate_up, activated;
};

Workspace& workspace() {
  thread_local Workspace space;
  return space;
}

float* sized(std::vector<float>& buffer, int64_t size) {
  if (int64_t(buffer.size()) < size) buffer.resize(size);
  return buffer.data();
}

class DecoderLayer : public torch::CustomClassHolder {
 public:
  DecoderLayer(int64_t layer_index, int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
               int64_t intermediate_size, double scale, int64_t window, double eps, const std::string& activation,
               const std::string& isa)
      : layer_(layer_index), hidden_(hidden_size), heads_(num_heads), kv_heads_(num_kv_heads), head_dim_(head_dim),
        intermediate_(intermediate_size), scale_(float(scale)), window_(window), eps_(float(eps)),
        isa_(parse_isa(isa)) {
    TORCH_CHECK(activation == "silu" || activation == "gelu_tanh", "dpgate DecoderLayer: unknown activation ",
                activation);
    TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0 && head_dim % 8 == 0 && hidden_size % 8 == 0 &&
                    intermediate_size % 8 == 0,
                "dpgate DecoderLayer: heads must be a multiple of kv heads, sizes multiples of 8");
    activation_ = activation == "silu" ? Activation::kSilu : Activation::kGeluTanh;
  }

  // Norm weights are the effective float32 scales (Gemma's 1 + w already added); the optional
  // ones are Gemma's per-head q/k norms and its norm after attention.
  void set_attention(const c10::intrusive_ptr<LinearWeights>& qkv, const c10::intrusive_ptr<LinearWeights>& o,
                     const at::Tensor& input_norm, const std::optional<at::Tensor>& q_norm,
                     const std::optional<at::Tensor>& k_norm, const std::optional<at::Tensor>& post_norm) {
    check_linear(qkv, hidden_, (heads_ + 2 * kv_heads_) * head_dim_, "qkv_proj");
    check_linear(o, heads_ * head_dim_, hidden_, "o_proj");
    check_vector(input_norm, hidden_, "input_norm");
    check_vector(q_norm, head_dim_, "q_norm");
    check_vector(k_norm, head_dim_, "k_norm");
    check_vector(post_norm, hidden_, "post_attention_norm");
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "dpgate DecoderLayer: q_norm and k_norm come together");
    qkv_ = qkv, o_ = o, input_norm_ = input_norm, q_norm_ = q_norm, k_norm_ = k_norm, post_attention_norm_ = post_norm;
  }

  // The MLP's norm before (Llama's post_attention_layernorm, Gemma's pre_feedforward_layernorm)
  // and, optionally, after (Gemma's post_feedforward_layernorm).
  void set_mlp(const c10::intrusive_ptr<LinearWeights>& gate_up, const c10::intrusive_ptr<LinearWeights>& down,
               const at::Tensor& pre_norm, const std::optional<at::Tensor>& post_norm) {
    check_linear(gate_up, hidden_, 2 * intermediate_, "gate_up_proj");
    check_linear(down, intermediate_, hidden_, "down_proj");
    check_vector(pre_norm, hidden_, "pre_mlp_norm");
    check_vector(post_norm, hidden_, "post_mlp_norm");
    gate_up_ = gate_up, down_ = down, mlp_norm_ = pre_norm, post_mlp_norm_ = post_norm;
  }

  // hidden [T, hidden] float32; cos / signed_sin [T, 1, D] (or [T, D]) float32; caches
  // [layers, kv_heads, slots, D] float32; slot_mapping [T] int64; block_tables [seqs, blocks]
  // int32; token_seq [T] int32; positions [T] int64. Returns the layer's output [T, hidden].
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& signed_sin,
                     const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& slot_mapping,
                     const at::Tensor& block_tables, const at::Tensor& token_seq, const at::Tensor& positions,
                     int64_t block_size) {
    TORCH_CHECK(qkv_ && gate_up_, "dpgate DecoderLayer: set_attention and set_mlp first");
    const int64_t T = hidden.size(0), D = head_dim_, H = heads_, KVH = kv_heads_;
    TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == hidden_ && hidden.scalar_type() == at::kFloat &&
                    hidden.is_contiguous(),
                "dpgate DecoderLayer: hidden must be float32 [tokens, ", hidden_, "], contiguous");
    for (const at::Tensor* table : {&cos, &signed_sin}) {
      TORCH_CHECK(table->scalar_type() == at::kFloat && table->is_contiguous() && table->numel() == T * D,
                  "dpgate DecoderLayer: rotary tables must be float32 [tokens, 1, head_dim], contiguous");
    }
    TORCH_CHECK(key_cache.dim() == 4 && key_cache.scalar_type() == at::kFloat && key_cache.is_contiguous() &&
                    value_cache.sizes() == key_cache.sizes() && value_cache.scalar_type() == at::kFloat &&
                    value_cache.is_contiguous() && layer_ < key_cache.size(0) && key_cache.size(1) == KVH &&
                    key_cache.size(3) == D,
                "dpgate DecoderLayer: caches must be float32 [layers, kv_heads, slots, head_dim], contiguous");
    TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == T && slot_mapping.is_contiguous(),
                "dpgate DecoderLayer: slot_mapping must be int64 [tokens]");
    TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt && block_tables.is_contiguous(),
                "dpgate DecoderLayer: block_tables must be int32 [seqs, blocks]");
    TORCH_CHECK(token_seq.scalar_type() == at::kInt && token_seq.numel() == T && token_seq.is_contiguous() &&
                    positions.scalar_type() == at::kLong && positions.numel() == T && positions.is_contiguous(),
                "dpgate DecoderLayer: token_seq must be int32 [tokens], positions int64 [tokens]");
    TORCH_CHECK(block_size > 0, "dpgate DecoderLayer: block_size must be positive");
    at::Tensor out = at::empty({T, hidden_}, hidden.options());
    if (T == 0) return out;

    PhaseTimer timer;
    const double started = clock_enabled.load(std::memory_order_relaxed) ? thread_seconds() : 0.0;
    Workspace& space = workspace();
    const float* h = hidden.data_ptr<float>();
    const int64_t qkv_width = (H + 2 * KVH) * D, slots = key_cache.size(2);
    const int64_t* slot_of = slot_mapping.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t) {
      TORCH_CHECK(0 <= slot_of[t] && slot_of[t] < slots, "dpgate DecoderLayer: slot_mapping out of range");
    }

    float* normed = sized(space.normed, T * hidden_);
    timer.next(kOther);
    norm(h, normed, T, hidden_, input_norm_);
    timer.next(kNorms);
    float* qkv = sized(space.qkv, T * qkv_width);
    qkv_->run(isa_, normed, hidden_, T, qkv, DType::kFloat32, qkv_width);
    timer.next(kMatmul);

    // q and k into their own rows, normalized per head (Gemma) and rotated; k and v into the cache.
    float* q = sized(space.q, T * H * D);
    float* k = sized(space.k, T * KVH * D);
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(q + t * H * D, qkv + t * qkv_width, sizeof(float) * H * D);
      std::memcpy(k + t * KVH * D, qkv + t * qkv_width + H * D, sizeof(float) * KVH * D);
    }
    timer.next(kOther);
    if (q_norm_.has_value()) {
      norm(q, q, T * H, D, *q_norm_);
      norm(k, k, T * KVH, D, *k_norm_);
    }
    timer.next(kNorms);
    rotate(q, T * H, H, D, cos.data_ptr<float>(), signed_sin.data_ptr<float>());
    rotate(k, T * KVH, KVH, D, cos.data_ptr<float>(), signed_sin.data_ptr<float>());
    float* keys = key_cache.data_ptr<float>() + layer_ * KVH * slots * D;
    float* values = value_cache.data_ptr<float>() + layer_ * KVH * slots * D;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t g = 0; g < KVH; ++g) {
        const int64_t offset = (g * slots + slot_of[t]) * D;
        std::memcpy(keys + offset, k + (t * KVH + g) * D, sizeof(float) * D);
        std::memcpy(values + offset, qkv + t * qkv_width + (H + KVH + g) * D, sizeof(float) * D);
      }
    }

    float* attended = sized(space.attended, T * H * D);
    const AttentionArgs attention{q, attended, DType::kFloat32, keys, values, DType::kFloat32,
                                  block_tables.data_ptr<int32_t>(), block_tables.size(1), token_seq.data_ptr<int32_t>(),
                                  positions.data_ptr<int64_t>(), T, H, KVH, D, slots, block_size, window_, scale_,
                                  1, 0, 1, nullptr};
    timer.next(kOther);
    launch_attention(isa_, attention);
    timer.next(kAttention);
    float* projected = sized(space.projected, T * hidden_);
    o_->run(isa_, attended, H * D, T, projected, DType::kFloat32, hidden_);
    timer.next(kMatmul);
    if (post_attention_norm_.has_value()) norm(projected, projected, T, hidden_, *post_attention_norm_);
    timer.next(kNorms);
    float* result = out.data_ptr<float>();
    add_into(result, h, projected, T * hidden_);
    timer.next(kOther);

    norm(result, normed, T, hidden_, mlp_norm_);
    timer.next(kNorms);
    float* gate_up = sized(space.gate_up, T * 2 * intermediate_);
    gate_up_->run(isa_, normed, hidden_, T, gate_up, DType::kFloat32, 2 * intermediate_);
    timer.next(kMatmul);
    float* activated = sized(space.activated, T * intermediate_);
    launch_act_and_mul(isa_, {gate_up, activated, DType::kFloat32, intermediate_, activation_}, T);
    timer.next(kOther);
    down_->run(isa_, activated, intermediate_, T, projected, DType::kFloat32, hidden_);
    timer.next(kMatmul);
    if (post_mlp_norm_.has_value()) norm(projected, projected, T, hidden_, *post_mlp_norm_);
    timer.next(kNorms);
    add_into(result, result, projected, T * hidden_);
    timer.next(kOther);
    if (started > 0.0) phase_seconds[kWhole] += thread_seconds() - started;
    return out;
  }

 private:
  void norm(const float* x, float* y, int64_t rows, int64_t size, const at::Tensor& weight) const {
    launch_rms_norm(isa_, {x, y, DType::kFloat32, weight.data_ptr<float>(), size, eps_}, rows);
  }

  int64_t layer_, hidden_, heads_, kv_heads_, head_dim_, intermediate_;
  float scale_;
  int64_t window_;
  float eps_;
  Isa isa_;
  Activation activation_ = Activation::kSilu;
  c10::intrusive_ptr<LinearWeights> qkv_, o_, gate_up_, down_;
  at::Tensor input_norm_, mlp_norm_;
  std::optional<at::Tensor> q_norm_, k_norm_, post_attention_norm_, post_mlp_norm_;
};

// Turns the phase clock on or off and returns what it summed on this thread since the last call
// (matmul, attention, norms, other, whole layer; seconds), resetting it.
std::vector<double> layer_clock(bool enable) {
  std::vector<double> seconds(phase_seconds, phase_seconds + kPhases);
  for (double& phase : phase_seconds) phase = 0.0;
  clock_enabled.store(enable, std::memory_order_relaxed);
  return seconds;
}

}  // namespace
}  // namespace dpgate

TORCH_LIBRARY_FRAGMENT(dpgate, m) {
  m.def("layer_clock(bool enable) -> float[]", &dpgate::layer_clock);
  m.class_<dpgate::LinearWeights>("LinearWeights")
      .def(torch::init<int64_t>())
      .def("add_packed", &dpgate::LinearWeights::add_packed)
      .def("add_quantized", &dpgate::LinearWeights::add_quantized)
      .def("add_int_dot", &dpgate::LinearWeights::add_int_dot)
      .def("forward", &dpgate::LinearWeights::forward)
      .def("in_features", &dpgate::LinearWeights::in_features)
      .def("out_features", &dpgate::LinearWeights::out_features);
  m.class_<dpgate::DecoderLayer>("DecoderLayer")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, int64_t, double, std::string,
                       std::string>())
      .def("set_attention", &dpgate::DecoderLayer::set_attention)
      .def("set_mlp", &dpgate::DecoderLayer::set_mlp)
      .def("forward", &dpgate::DecoderLayer::forward);
}
