#!/usr/bin/env python3
"""Writes grad_sample.npy: a synthetic gradient of one linear layer (256 x 1024, float32).

Not from a trained model (the real dumps come with the giftc issue); it imitates what makes
real LLM weight gradients hard for FP8: the gradient of y = W x over a batch is
G = sum_t delta_t x_t^T, with input activations x whose covariance has a fast-decaying
spectrum and a few outlier channels (20x scale), and heavy-tailed output-side errors delta.
Deterministic (fixed seed): with the same NumPy and BLAS it reproduces the committed file.
"""
import numpy as np

rng = np.random.default_rng(20261202)
d_out, d_in, tokens = 256, 1024, 512

spectrum = 1.0 / (1.0 + np.arange(d_in)) ** 0.8          # decaying activation spectrum
basis, _ = np.linalg.qr(rng.standard_normal((d_in, d_in)))
x = (rng.standard_normal((tokens, d_in)) * np.sqrt(spectrum)) @ basis.T
x[:, rng.choice(d_in, 6, replace=False)] *= 20.0         # outlier channels
delta = rng.standard_t(df=3, size=(tokens, d_out)) * 1e-3  # heavy-tailed output errors
grad = (delta.T @ x / tokens).astype(np.float32)

np.save("grad_sample.npy", grad)
print(f"grad_sample.npy: {grad.shape} float32, rms {np.sqrt(np.mean(grad**2)):.3e}, "
      f"amax {np.abs(grad).max():.3e}")
