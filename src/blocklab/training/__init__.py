"""Training: the toy tasks, the training loop, the copy-task sweep (per run and batched), bf16/fp32 precision."""
