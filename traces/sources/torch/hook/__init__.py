"""The directory `alloctrace record` puts first on a Python program's PYTHONPATH: its `sitecustomize`
switches PyTorch's CUDA memory history on from the program's `import torch` and dumps the snapshot."""
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent
