/* A program linked at startup against fake_client (and through it the stub runtime), so the runtime is in the
 * global search scope. Arguments: a script of "m<bytes>" (cudaMalloc through the client library) and "f"
 * (cudaFree of the most recent allocation). Prints one line per step: "<step> <error> <ptr>".
 * "l<N>": N cudaMalloc(4096) + cudaFree pairs, timed; prints "l<N> <ns per pair>" (benchmarks/gpu_shim_overhead.py). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
extern int client_malloc(void **p, size_t size);
extern int client_free(void *p);

int main(int argc, char **argv) {
    void *stack[256];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == 'm' && n < 256) {
            void *p = NULL;
            int rc = client_malloc(&p, (size_t)strtoull(argv[i] + 1, NULL, 10));
            printf("%s %d %p\n", argv[i], rc, p);
            if (rc == 0) stack[n++] = p;
        } else if (argv[i][0] == 'l') {
            long count = strtol(argv[i] + 1, NULL, 10);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (long k = 0; k < count; k++) {
                void *p = NULL;
                client_malloc(&p, 4096);
                client_free(p);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
            printf("%s %.1f\n", argv[i], count > 0 ? ns / count : 0.0);
        } else if (argv[i][0] == 'f' && n > 0) {
            void *p = stack[--n];
            printf("f %d %p\n", client_free(p), p);
        }
    }
    return 0;
}
