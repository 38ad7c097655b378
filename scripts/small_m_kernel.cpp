// The experiment behind the README's "Verifying n tokens on this CPU": y = x W^T for a few rows of x.
//
// Each output is a dot product of an x row and a W row. W is streamed once; for every stretch of
// 16 floats of R rows of W, the M rows of x are reused from registers, so M x R accumulators
// stay in AVX-512 registers. Build: g++ -O3 -march=native -shared -fPIC -o small_m_kernel.so small_m_kernel.cpp
#include <immintrin.h>
#include <cstdint>

template <int M, int R>
static inline void tile(const float* x, int K, const float* w, float* y, int N, int n) {
    __m512 acc[M][R];
    for (int m = 0; m < M; ++m)
        for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        __m512 rows[R];
        for (int r = 0; r < R; ++r) rows[r] = _mm512_loadu_ps(w + int64_t(n + r) * K + k);
        for (int m = 0; m < M; ++m) {
            const __m512 column = _mm512_loadu_ps(x + m * K + k);
            for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(column, rows[r], acc[m][r]);
        }
    }
    for (int m = 0; m < M; ++m)
        for (int r = 0; r < R; ++r) y[m * N + n + r] = _mm512_reduce_add_ps(acc[m][r]);
}

template <int M, int R>
static void rows(const float* x, int K, const float* w, int N, float* y) {
    int n = 0;
    for (; n + R <= N; n += R) tile<M, R>(x, K, w, y, N, n);
    for (; n < N; ++n) tile<M, 1>(x, K, w, y, N, n);
}

// x: [M, K], w: [N, K], y: [M, N], all float32 and contiguous; K a multiple of 16.
extern "C" void small_m_linear(const float* x, int M, int K, const float* w, int N, float* y) {
    for (int first = 0; first < M; first += 8) {
        const float* xs = x + first * K;
        float* ys = y + first * N;
        switch (M - first < 8 ? M - first : 8) {
            case 1: rows<1, 8>(xs, K, w, N, ys); break;
            case 2: rows<2, 6>(xs, K, w, N, ys); break;
            case 3: rows<3, 4>(xs, K, w, N, ys); break;
            case 4: rows<4, 4>(xs, K, w, N, ys); break;
            case 5: rows<5, 3>(xs, K, w, N, ys); break;
            case 6: rows<6, 3>(xs, K, w, N, ys); break;
            case 7: rows<7, 2>(xs, K, w, N, ys); break;
            default: rows<8, 2>(xs, K, w, N, ys); break;
        }
    }
}
