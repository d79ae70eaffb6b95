"""Optional compiled kernels (C, built on first use; see ``build.py``). Speed only: each has a
pure-torch equivalent that dpfy uses, with a warning, where the kernel cannot be built."""
