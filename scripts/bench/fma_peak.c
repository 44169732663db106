/* The FMA peak of one core in f32 GFLOP/s: 16 independent chains of
 * 512-bit fused multiply-adds (AVX-512, 32 registers) or 12 of 256-bit ones
 * (AVX2, 16 registers: more chains would spill), enough to hide the FMA
 * latency. The ceiling that README's speed figures are read
 * against. Built with AVX512_BF16 it also times 16 chains of VDPBF16PS
 * (each instruction adds 16 lanes of two bfloat16 products into f32: 32
 * multiply-adds), what the attention's `--products bf16` runs on.
 *
 *   gcc -O3 -mavx512f -mfma -o /tmp/fma_peak scripts/bench/fma_peak.c && /tmp/fma_peak
 *   gcc -O3 -mavx2 -mfma -o /tmp/fma_peak scripts/bench/fma_peak.c && /tmp/fma_peak
 *   gcc -O3 -mavx512f -mfma -mavx512bf16 -o /tmp/fma_peak scripts/bench/fma_peak.c && /tmp/fma_peak
 *
 * The last needs a CPU with AVX512_BF16 (`grep -o avx512_bf16 /proc/cpuinfo`).
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

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Prints `name`'s rate: `n` rounds of CHAINS instructions of `per`
 * multiply-adds each in `s` seconds; the checksum keeps the chains live. */
static void report(const char *name, long n, int per, double s, const vec *a) {
    float out[LANES], sum = 0;
    for (int i = 0; i < CHAINS; i++) {
        STORE(out, a[i]);
        sum += out[0];
    }
    printf("%s: %.1f GFLOP/s on one core (checksum %g)\n", name,
           n * (double)CHAINS * per * 2 / s / 1e9, sum);
}

int main(void) {
    vec a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = SET1(i * 0.001f);
    const vec b = SET1(0.9999f), c = SET1(0.0001f);
    const long n = 200000000;
    double t0 = seconds();
    for (long k = 0; k < n; k++)
        for (int i = 0; i < CHAINS; i++) a[i] = FMA(a[i], b, c);
    report(NAME, n, LANES, seconds() - t0, a);
#ifdef __AVX512BF16__
    for (int i = 0; i < CHAINS; i++) a[i] = SET1(i * 0.001f);
    const __m512bh x = _mm512_cvtne2ps_pbh(SET1(0.5f), SET1(0.25f));
    const __m512bh y = _mm512_cvtne2ps_pbh(SET1(0.001f), SET1(0.002f));
    const long m = n / 2;
    t0 = seconds();
    for (long k = 0; k < m; k++)
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    report("VDPBF16PS (bfloat16)", m, 32, seconds() - t0, a);
#endif
    return 0;
}
