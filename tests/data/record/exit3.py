"""Allocates one small graph with ggml's gallocr, prints a line, exits with status 3."""
import ggml

backend = ggml.ggml_backend_cpu_init()
ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=ggml.ggml_tensor_overhead() * 16 + ggml.ggml_graph_overhead(),
                                           mem_buffer=None, no_alloc=True))
x = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 16, 4)
ggml.ggml_set_input(x)
y = ggml.ggml_mul(ctx, ggml.ggml_silu(ctx, x), x)
gf = ggml.ggml_new_graph(ctx)
ggml.ggml_build_forward_expand(gf, y)
galloc = ggml.ggml_gallocr_new(ggml.ggml_backend_get_default_buffer_type(backend))
assert ggml.ggml_gallocr_alloc_graph(galloc, gf)
print("the program's own output")
raise SystemExit(3)
