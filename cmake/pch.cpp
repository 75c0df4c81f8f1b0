// Translation unit that only carries the precompiled LibTorch header.
