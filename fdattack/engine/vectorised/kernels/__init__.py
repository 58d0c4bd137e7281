"""CPU kernels of the vectorised path: im2col convolutions, batched linear layers, fused convolution + max-pool, the
model axis their vmap rules fold into, and the rewrite that swaps layer pairs. Torch alone, nothing of fdattack."""
