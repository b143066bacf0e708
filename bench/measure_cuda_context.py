"""The device memory a PyTorch process holds outside the caching allocator (a GPU machine).

    python3 bench/measure_cuda_context.py OUT.json

`torch.cuda.mem_get_info()` against what the allocator has reserved, after each step that creates something
outside it: the CUDA context (the first tensor), cuBLAS's handle (the first matmul), the autograd engine's
device thread and its own handle (the first backward through a matmul). `alloctrace plan` states these as a
separate line, never adding them to its prediction.
"""
import json
import sys

import torch


def outside() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def main(path):
    torch.cuda.init()
    before = torch.cuda.mem_get_info()
    a = torch.randn(256, 256, device="cuda")
    steps = {"context (first tensor)": outside()}
    b = a @ a
    torch.cuda.synchronize()
    steps["+ cuBLAS handle (first matmul)"] = outside()
    w = torch.randn(256, 256, device="cuda", requires_grad=True)
    (a @ w).sum().backward()
    torch.cuda.synchronize()
    steps["+ autograd device thread (first backward)"] = outside()
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
           "total_memory": before[1], "outside_allocator": steps}
    del b
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
