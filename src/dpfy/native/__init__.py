"""Optional kernels, for speed only: C kernels for the CPU (built on first use; see ``build.py``)
and Triton kernels for a GPU (``triton_support.py``; Triton comes with ``dpfy[gpu]``). Each has
a pure-torch equivalent that dpfy uses, with a warning, where the kernel cannot be built."""
