"""Inline-PTX helpers shared by the MMA decode kernels (``mma``), with their Triton twins for the interpreter
(``reference``)."""
