// The integer kernels' start-up self-check (dispatch.h, int_self_check): a CPU flag is not proof
// that an instruction path works (llama.cpp's AMX path dies with SIGILL on a machine that
// reports AMX), so an instruction set is served only after its kernels, run on this thread over
// a fixed problem, gave the scalar reference's bits. An illegal instruction is caught (SIGILL,
// for the duration of the check only) and reported instead of ending the process.
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"

namespace dpgate {
namespace {

thread_local sigjmp_buf* illegal_jump = nullptr;

void on_illegal_instruction(int) {
  if (illegal_jump != nullptr) siglongjmp(*illegal_jump, 1);
  std::signal(SIGILL, SIG_DFL);
  std::raise(SIGILL);
}

// A fixed problem: 5 rows (a 4-row tile and a lone row), K = 64, N = 40 (a padded panel), the
// two weight kinds the formats need (nibbles with offsets in groups of 32, signed bytes with
// bias 128 in groups of 16), codes at their extremes included.
struct Problem {
  static constexpr int64_t M = 5, K = 64, N = 40, P = 3;
  std::vector<float> x = std::vector<float>(M * K);
  std::vector<uint8_t> nibbles = std::vector<uint8_t>(P * K / 8 * 64), bytes = std::vector<uint8_t>(P * K / 4 * 64);
  std::vector<float> scales32 = std::vector<float>(P * (K / 32) * 16), offsets32 = std::vector<float>(P * (K / 32) * 16);
  std::vector<float> scales16 = std::vector<float>(P * (K / 16) * 16);

  Problem() {
    uint32_t state = 12345;
    auto next = [&] { return state = state * 1664525u + 1013904223u; };
    for (float& v : x) v = float(int32_t(next() >> 8) % 20001 - 10000) * 1e-3f;
    x[7] = 1e4f;  // one group dominated by a single value
    for (size_t i = 0; i < nibbles.size(); ++i) nibbles[i] = i < 64 ? 0xFF : uint8_t(next() >> 24);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = i < 64 ? (i % 2 ? 255 : 0) : uint8_t(next() >> 24);
    for (float& v : scales32) v = float(int32_t(next() >> 16) % 1000 + 1) * 1e-4f;
    for (float& v : offsets32) v = -float(int32_t(next() >> 16) % 1000) * 1e-3f;
    for (float& v : scales16) v = float(int32_t(next() >> 16) % 1000 + 1) * 1e-4f;
  }
};

struct Result {
  std::vector<int8_t> codes = std::vector<int8_t>(Problem::M * Problem::K);
  std::vector<float> scales = std::vector<float>(Problem::M * Problem::K / kActGroup);
  std::vector<int32_t> sums = std::vector<int32_t>(Problem::M * Problem::K / 16);
  std::vector<float> nibble_out = std::vector<float>(Problem::M * Problem::N);
  std::vector<float> byte_out = std::vector<float>(Problem::M * Problem::N);
};

template <class Quantize, class Plan, class Linear>
void run(const Problem& p, bool fault, Result& r, Quantize quantize, Plan plan_of, Linear linear) {
  const int64_t M = Problem::M, K = Problem::K, N = Problem::N;
  quantize(IntActs{p.x.data(), K, r.codes.data(), r.scales.data(), r.sums.data(), M, K}, 0, M);
  std::vector<uint8_t> nibbles = p.nibbles, bytes = p.bytes;
  if (fault) bytes[100] ^= 1;
  const IntLinearArgs nibble_args{r.codes.data(), r.scales.data(), r.sums.data(), nibbles.data(), true, 0, 32,
                                  p.scales32.data(), p.offsets32.data(), r.nibble_out.data(), DType::kFloat32, N,
                                  M, N, K};
  const IntLinearArgs byte_args{r.codes.data(), r.scales.data(), r.sums.data(), bytes.data(), false, 128, 16,
                                p.scales16.data(), nullptr, r.byte_out.data(), DType::kFloat32, N, M, N, K};
  for (const IntLinearArgs* args : {&nibble_args, &byte_args}) {
    for (int64_t rows : {M, int64_t(1)}) {  // the many-row tiles, then single-row tiles over row 0
      IntLinearArgs part = *args;
      part.M = rows;
      const LinearPlan plan = plan_of(rows, N, 1);
      const int64_t vectors = (N + plan.lanes - 1) / plan.lanes;
      linear(part, plan, 0, (vectors + plan.vectors - 1) / plan.vectors);
    }
  }
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

// Declared in dispatch.h (which needs torch's headers; this file does not).
std::string int_self_check(Isa isa, bool inject_fault);

std::string int_self_check(Isa isa, bool inject_fault) {
  const Problem problem;
  Result expected, got;
  run(problem, false, expected, scalar::int_quantize, scalar::int_linear_plan, scalar::int_linear);

  sigjmp_buf jump;
  struct sigaction handler{}, previous{};
  handler.sa_handler = on_illegal_instruction;
  sigemptyset(&handler.sa_mask);
  sigaction(SIGILL, &handler, &previous);
  bool illegal = false;
  if (sigsetjmp(jump, 1) == 0) {
    illegal_jump = &jump;
    switch (isa) {
      case Isa::kScalar: run(problem, inject_fault, got, scalar::int_quantize, scalar::int_linear_plan,
                             scalar::int_linear); break;
#if defined(__x86_64__)
      case Isa::kAvx2: run(problem, inject_fault, got, avx2::int_quantize, avx2::int_linear_plan,
                           avx2::int_linear); break;
      case Isa::kAvx512: run(problem, inject_fault, got, avx512::int_quantize, avx512::int_linear_plan,
                             avx512::int_linear); break;
      case Isa::kAvx512Vnni: run(problem, inject_fault, got, avx512_vnni::int_quantize,
                                 avx512_vnni::int_linear_plan, avx512_vnni::int_linear); break;
#endif
      default: break;
    }
  } else {
    illegal = true;
  }
  illegal_jump = nullptr;
  sigaction(SIGILL, &previous, nullptr);
  if (illegal) return "an illegal instruction (SIGILL)";
  if (!same_bits(got.codes, expected.codes) || !same_bits(got.scales, expected.scales) ||
      !same_bits(got.sums, expected.sums))
    return "its activation codes differ from the scalar reference's";
  if (!same_bits(got.nibble_out, expected.nibble_out) || !same_bits(got.byte_out, expected.byte_out))
    return "its integer dot products differ from the scalar reference's";
  return "";
}

}  // namespace dpgate
