"""Toy tasks: the copy task of document 000 and the reverse-copy task of document 004 exercise 3."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def copy_batch(batch_size: int, seq_len: int, vocab_size: int, generator: torch.Generator | None = None, device="cpu"):
    """``seq_len`` random tokens followed by the same tokens again; returns (inputs, targets) for next-token prediction.

    Targets of the first half are -100 (ignored): the first half is random and cannot be predicted, so the loss
    covers only the copy half, and a model that learned nothing sits at ln(vocab_size).
    """
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator).to(device)
    sequence = torch.cat([tokens, tokens], dim=1)
    inputs, targets = sequence[:, :-1], sequence[:, 1:].clone()
    targets[:, : seq_len - 1] = -100
    return inputs, targets


def copy_loss(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def reverse_batch(batch_size: int, seq_len: int, vocab_size: int, generator: torch.Generator | None = None, device="cpu"):
    """Source: random tokens 1..V-1; target: the source reversed. Token 0 is the decoder's start token.

    Returns (source, decoder_input, target) with decoder_input = [0] + target[:-1] (teacher forcing).
    """
    source = torch.randint(1, vocab_size, (batch_size, seq_len), generator=generator).to(device)
    target = source.flip(1)
    start = torch.zeros(batch_size, 1, dtype=source.dtype, device=source.device)
    return source, torch.cat([start, target[:, :-1]], dim=1), target
