/* CP_HOT marks the host's element loops: on x86-64 Linux with gcc, an AVX2
 * clone beside the baseline one, chosen at load time (ifunc). Both clones
 * compute the same bits: no FMA contraction (-std=c11 keeps it off, and
 * AVX2 alone does not enable FMA) and no reassociation. */
#ifndef COMMPLAN_SIMD_H
#define COMMPLAN_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CP_HOT __attribute__((target_clones("avx2", "default")))
#else
#define CP_HOT
#endif

/* for (j = 0; j < n; j++) body, with a constant-count copy for full blocks
 * of CP_BLOCK elements: gcc -O2's cost model vectorizes only loops whose
 * count it knows. */
#define CP_LOOP(n, body)                                                                                               \
    do {                                                                                                               \
        if ((n) == CP_BLOCK)                                                                                           \
            for (int j = 0; j < CP_BLOCK; j++) { body; }                                                               \
        else                                                                                                           \
            for (int64_t j = 0; j < (n); j++) { body; }                                                                \
    } while (0)

#endif
