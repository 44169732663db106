/* The bfloat16 dot-product peak of one core in GFLOP/s (AVX512_BF16's
 * VDPBF16PS: each 512-bit instruction adds 16 lanes of two bf16 products
 * into f32, 32 multiply-adds): 16 independent chains, as fma_peak.c does for
 * f32. What the attention's products could reach in bfloat16, beside the f32
 * ceiling the README's speed figures are read against.
 *
 *   gcc -O3 -mavx512f -mavx512bf16 -o /tmp/bf16_peak scripts/bench/bf16_peak.c && /tmp/bf16_peak
 *
 * Needs a CPU with AVX512_BF16 (`grep -o avx512_bf16 /proc/cpuinfo`). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define CHAINS 16

int main(void) {
    __m512 a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps(i * 0.001f);
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
    const __m512bh c = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.001f), _mm512_set1_ps(0.002f));
    const long n = 100000000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long k = 0; k < n; k++)
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], b, c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    float out[16], sum = 0;
    for (int i = 0; i < CHAINS; i++) {
        _mm512_storeu_ps(out, a[i]);
        sum += out[0];
    }
    printf("VDPBF16PS: %.1f GFLOP/s on one core (checksum %g)\n",
           n * (double)CHAINS * 32 * 2 / s / 1e9, sum);
    return 0;
}
