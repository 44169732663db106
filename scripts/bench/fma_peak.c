/* The FMA peak of one core in f32 GFLOP/s: 16 independent chains of
 * 512-bit fused multiply-adds (AVX-512, 32 registers) or 12 of 256-bit ones
 * (AVX2, 16 registers: more chains would spill), enough to hide the FMA
 * latency. The ceiling that README's speed figures are read
 * against.
 *
 *   gcc -O3 -mavx512f -mfma -o /tmp/fma_peak scripts/bench/fma_peak.c && /tmp/fma_peak
 *   gcc -O3 -mavx2 -mfma -o /tmp/fma_peak scripts/bench/fma_peak.c && /tmp/fma_peak
 *
 * Run two at once (`/tmp/fma_peak & /tmp/fma_peak; wait`) for both cores. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#ifdef __AVX512F__
typedef __m512 vec;
#define LANES 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define STORE _mm512_storeu_ps
#define NAME "AVX-512"
#define CHAINS 16
#else
typedef __m256 vec;
#define LANES 8
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define STORE _mm256_storeu_ps
#define NAME "AVX2"
#define CHAINS 12
#endif

int main(void) {
    vec a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = SET1(i * 0.001f);
    const vec b = SET1(0.9999f), c = SET1(0.0001f);
    const long n = 200000000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long k = 0; k < n; k++)
        for (int i = 0; i < CHAINS; i++) a[i] = FMA(a[i], b, c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    float out[LANES], sum = 0;
    for (int i = 0; i < CHAINS; i++) {
        STORE(out, a[i]);
        sum += out[0];
    }
    printf("%s: %.1f GFLOP/s on one core (checksum %g)\n", NAME,
           n * (double)CHAINS * LANES * 2 / s / 1e9, sum);
    return 0;
}
