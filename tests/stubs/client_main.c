/* A program linked at startup against fake_client (and through it the stub runtime), so the runtime is in the
 * global search scope. Arguments: a script of "m<bytes>" (cudaMalloc through the client library) and "f"
 * (cudaFree of the most recent allocation). Prints one line per step: "<step> <error> <ptr>". */
#include <stdio.h>
#include <stdlib.h>
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
        } else if (argv[i][0] == 'f' && n > 0) {
            void *p = stack[--n];
            printf("f %d %p\n", client_free(p), p);
        }
    }
    return 0;
}
