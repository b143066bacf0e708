/* A small ggml program with its own declarations (no ggml headers needed): builds a graph,
 * allocates it with ggml_gallocr on the CPU buffer type, and writes every placed tensor's
 * name and data pointer to argv[1]. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct ggml_init_params { size_t mem_size; void *mem_buffer; bool no_alloc; };
enum { F32 = 0 };

void *ggml_init(struct ggml_init_params);
size_t ggml_tensor_overhead(void);
size_t ggml_graph_overhead(void);
void *ggml_new_tensor_2d(void *ctx, int type, int64_t ne0, int64_t ne1);
void *ggml_add(void *ctx, void *a, void *b);
void *ggml_mul(void *ctx, void *a, void *b);
void *ggml_mul_mat(void *ctx, void *a, void *b);
void *ggml_silu(void *ctx, void *a);
void *ggml_soft_max(void *ctx, void *a);
void *ggml_set_name(void *t, const char *name);
const char *ggml_get_name(const void *t);
void *ggml_get_data(const void *t);
void ggml_set_input(void *t);
void ggml_set_output(void *t);
void *ggml_new_graph(void *ctx);
void ggml_build_forward_expand(void *graph, void *t);
void *ggml_backend_cpu_buffer_type(void);
void *ggml_gallocr_new(void *buft);
bool ggml_gallocr_alloc_graph(void *galloc, void *graph);
void ggml_gallocr_free(void *galloc);
void ggml_free(void *ctx);

int main(int argc, char **argv) {
    struct ggml_init_params p = {ggml_tensor_overhead() * 64 + ggml_graph_overhead(), NULL, true};
    void *ctx = ggml_init(p);
    void *x = ggml_set_name(ggml_new_tensor_2d(ctx, F32, 64, 8), "x");
    void *w = ggml_set_name(ggml_new_tensor_2d(ctx, F32, 64, 64), "w");
    ggml_set_input(x);
    ggml_set_input(w);
    void *h = ggml_set_name(ggml_mul_mat(ctx, w, x), "h");
    void *a = ggml_set_name(ggml_silu(ctx, h), "a");
    void *g = ggml_set_name(ggml_mul(ctx, a, h), "g");
    void *s = ggml_set_name(ggml_soft_max(ctx, g), "s");
    void *o = ggml_set_name(ggml_add(ctx, s, x), "out");
    ggml_set_output(o);
    void *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, o);
    void *galloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    if (!ggml_gallocr_alloc_graph(galloc, gf)) return 1;
    FILE *f = fopen(argv[1], "w");
    void *ts[] = {x, w, h, a, g, s, o};
    for (int i = 0; i < 7; i++) fprintf(f, "%s %p\n", ggml_get_name(ts[i]), ggml_get_data(ts[i]));
    fclose(f);
    ggml_gallocr_free(galloc);
    ggml_free(ctx);
    return 0;
}
