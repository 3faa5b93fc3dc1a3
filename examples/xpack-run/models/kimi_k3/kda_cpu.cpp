// KDA's short convolution, decay gate and gated delta rule on the CPU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../../cpu_backend.h"
#include "kimi_ops_cpu.h"

namespace xrun::kimi_k3 {

namespace {

// ggml_softplus
float softplus_ggml(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

// e^x for a log decay x <= 0, zero below e^-60: a factor that small is far under
// float's resolution next to what it is summed with, and flushing it here keeps
// subnormal operands (a microcode assist per operation on x86) out of the sums
// without a process-wide flush-to-zero mode.
constexpr double kFlushBelow = -60.0;
float decay_factor(double x) { return x < kFlushBelow ? 0.0f : std::exp(static_cast<float>(x)); }

}  // namespace

void CpuKimiOps::short_conv_silu(const Tensor& x, const Tensor& weight, const Tensor& state) {
  const int64_t D = x.width(), n = x.rows(), d_conv = weight.width(), n_prev = d_conv - 1;
  check_shape(weight.rows() == D && state.width() == D && state.rows() == n_prev, "short_conv shapes disagree");
  std::vector<float> hist(static_cast<size_t>((n_prev + n) * D));
  std::copy_n(state.f32(), n_prev * D, hist.begin());
  std::copy_n(x.f32(), n * D, hist.begin() + n_prev * D);
  const float* w = weight.f32();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < D; ++c) {
      float sum = 0.0f;
      for (int64_t j = 0; j < d_conv; ++j) sum += hist[(t + j) * D + c] * w[c * d_conv + j];
      x.f32()[t * D + c] = silu(sum);
    }
  }
  std::copy(hist.end() - n_prev * D, hist.end(), state.f32());
}

void CpuKimiOps::kda_gate(const Tensor& g, const Tensor& dt_bias, const Tensor& a, int64_t head_dim,
                          bool has_lower_bound, float lower_bound) {
  const int64_t D = g.width(), H = D / head_dim;
  check_shape(D % head_dim == 0 && dt_bias.numel() == D && a.numel() == H, "kda_gate shapes disagree");
  for (int64_t t = 0; t < g.rows(); ++t) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < head_dim; ++i) {
        float& gi = g.f32()[t * D + h * head_dim + i];
        gi += dt_bias.f32()[h * head_dim + i];
        // ssm_a holds -exp(A_log) (folded at conversion), so exp(A_log) = -ssm_a.
        // The lower bound is not a clamp: it swaps the activation for a scaled sigmoid.
        if (has_lower_bound)
          gi = lower_bound * sigmoid(-(gi * a.f32()[h]));
        else
          gi = softplus_ggml(gi) * a.f32()[h];
      }
    }
  }
}

void CpuKimiOps::delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                            const Tensor& state, const Tensor& o) {
  const int64_t hd = delta_rule_head_dim(q, k, v, g, beta, state, o);
  const int64_t D = q.width(), H = beta.width(), n = q.rows();
  pool_.parallel_for(H, 0, [&](int64_t h0, int64_t h1) {
    std::vector<float> sk(static_cast<size_t>(hd)), d(static_cast<size_t>(hd));
    for (int64_t h = h0; h < h1; ++h) {
      float* S = state.f32() + h * hd * hd;  // S[i*hd + j]: key i, value j
      for (int64_t t = 0; t < n; ++t) {
        const float* gt = g.f32() + t * D + h * hd;
        const float* kt = k.f32() + t * D + h * hd;
        const float* vt = v.f32() + t * D + h * hd;
        const float* qt = q.f32() + t * D + h * hd;
        const float bt = beta.f32()[t * H + h];
        for (int64_t i = 0; i < hd; ++i) {
          const float decay = std::exp(gt[i]);
          for (int64_t j = 0; j < hd; ++j) S[i * hd + j] *= decay;
        }
        std::fill(sk.begin(), sk.end(), 0.0f);
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t j = 0; j < hd; ++j) sk[j] += S[i * hd + j] * kt[i];
        for (int64_t j = 0; j < hd; ++j) d[j] = (vt[j] - sk[j]) * bt;
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t j = 0; j < hd; ++j) S[i * hd + j] += kt[i] * d[j];
        float* ot = o.f32() + t * D + h * hd;
        std::fill(ot, ot + hd, 0.0f);
        for (int64_t i = 0; i < hd; ++i)
          for (int64_t j = 0; j < hd; ++j) ot[j] += S[i * hd + j] * qt[i];
      }
    }
  });
}

// The chunked form of kimi_ops.h, per head and chunk of L tokens from state S0.
// Work per token: the recurrence's (S0 against k and q, the state update) plus
// L/2 exps per key channel for the pairwise factors e^(G_r - G_s), each at most 1
// (G falls, so no factor can overflow however strong the decay).
void CpuKimiOps::delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                    const Tensor& beta, const Tensor& state, const Tensor& o, int64_t chunk) {
  check_shape(chunk > 0, "delta_rule_chunked: the chunk length must be positive");
  const int64_t hd = delta_rule_head_dim(q, k, v, g, beta, state, o);
  const int64_t D = q.width(), H = beta.width(), n = q.rows();
  const size_t C = static_cast<size_t>(std::min(chunk, std::max<int64_t>(n, 1))), w = static_cast<size_t>(hd);
  pool_.parallel_for(H, 0, [&](int64_t h0, int64_t h1) {
    std::vector<double> G(C * w);          // running sum of g from the chunk's start, [r][i]
    std::vector<float> A(C * C), B(C * C);  // lower triangles, [r][s]
    std::vector<float> d(C * w);            // the chunk's deltas, [r][j]
    for (int64_t h = h0; h < h1; ++h) {
      float* S = state.f32() + h * hd * hd;  // S[i*hd + j]: key i, value j
      for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        const int64_t L = std::min(chunk, n - t0);
        auto row = [&](const Tensor& x, int64_t r) { return x.f32() + (t0 + r) * D + h * hd; };
        for (int64_t r = 0; r < L; ++r) {
          const float* gr = row(g, r);
          for (int64_t i = 0; i < hd; ++i) G[r * hd + i] = (r > 0 ? G[(r - 1) * hd + i] : 0.0) + double(gr[i]);
        }
        for (int64_t r = 0; r < L; ++r) {
          const float *kr = row(k, r), *qr = row(q, r);
          const double* Gr = &G[r * hd];
          for (int64_t s = 0; s <= r; ++s) {
            const float* ks = row(k, s);
            const double* Gs = &G[s * hd];
            float a = 0.0f, b = 0.0f;
            for (int64_t i = 0; i < hd; ++i) {
              const float kf = ks[i] * decay_factor(Gr[i] - Gs[i]);
              a += kr[i] * kf;
              b += qr[i] * kf;
            }
            A[r * C + s] = a;
            B[r * C + s] = b;
          }
        }
        // d_r = beta_r (v_r - Kbar_r S0 - sum_{s<r} A[r][s] d_s): one forward
        // substitution; o_r = Qbar_r S0 + sum_{s<=r} B[r][s] d_s
        for (int64_t r = 0; r < L; ++r) {
          const float *kr = row(k, r), *qr = row(q, r), *vr = row(v, r);
          float* dr = &d[r * hd];
          float* orow = row(o, r);
          std::copy_n(vr, hd, dr);
          std::fill_n(orow, hd, 0.0f);
          for (int64_t i = 0; i < hd; ++i) {
            const float e = decay_factor(G[r * hd + i]), kb = kr[i] * e, qb = qr[i] * e;
            const float* Si = S + i * hd;
            for (int64_t j = 0; j < hd; ++j) {
              dr[j] -= kb * Si[j];
              orow[j] += qb * Si[j];
            }
          }
          for (int64_t s = 0; s < r; ++s) {
            const float a = A[r * C + s];
            const float* ds = &d[s * hd];
            for (int64_t j = 0; j < hd; ++j) dr[j] -= a * ds[j];
          }
          const float br = beta.f32()[(t0 + r) * H + h];
          for (int64_t j = 0; j < hd; ++j) dr[j] *= br;
          for (int64_t s = 0; s <= r; ++s) {
            const float bs = B[r * C + s];
            const float* ds = &d[s * hd];
            for (int64_t j = 0; j < hd; ++j) orow[j] += bs * ds[j];
          }
        }
        // S = diag(e^G_last) S0 + Ktilde^T D
        const double* Gl = &G[(L - 1) * hd];
        for (int64_t i = 0; i < hd; ++i) {
          const float e = decay_factor(Gl[i]);
          for (int64_t j = 0; j < hd; ++j) S[i * hd + j] *= e;
        }
        for (int64_t r = 0; r < L; ++r) {
          const float* kr = row(k, r);
          const float* dr = &d[r * hd];
          for (int64_t i = 0; i < hd; ++i) {
            const float kt = kr[i] * decay_factor(Gl[i] - G[r * hd + i]);
            float* Si = S + i * hd;
            for (int64_t j = 0; j < hd; ++j) Si[j] += kt * dr[j];
          }
        }
      }
    }
  });
}

}  // namespace xrun::kimi_k3
