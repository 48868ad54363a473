"""Turning dataset examples into padded tensor batches, with length bucketing."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from seqserve.models.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class EncodedExample:
    """One tokenized example: input ids and either a label index or target ids."""

    source: list[int]
    label: int = -1
    target: tuple[int, ...] = ()


def encode_classification(rows: Sequence[dict[str, str]], tok: Tokenizer, labels: list[str],
                          max_length: int) -> list[EncodedExample]:
    """Texts truncated to max_length tokens (an empty text becomes one unk token)."""
    index = {label: i for i, label in enumerate(labels)}
    return [EncodedExample((tok.encode(r["text"]) or [tok.unk_id])[:max_length], index[r["label"]])
            for r in rows]


def encode_translation(rows: Sequence[dict[str, str]], tok: Tokenizer,
                       max_length: int) -> list[EncodedExample]:
    """Sources truncated to max_length tokens, targets to max_length - 1 (room for bos/eos)."""
    return [EncodedExample((tok.encode(r["source"]) or [tok.unk_id])[:max_length], -1,
                    tuple(tok.encode(r["target"])[: max_length - 1])) for r in rows]


def pad(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> Tensor:
    """Right-pad int sequences into (B, T) int64."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def collate(batch: Sequence[EncodedExample], bos_id: int = 2, eos_id: int = 3,
            pad_id: int = 0) -> dict[str, Tensor]:
    """Tensors for one batch: src ids/lengths plus labels, or tgt_in/tgt_out."""
    out = {"ids": pad([e.source for e in batch], pad_id),  # (B, S)
           "lengths": torch.tensor([len(e.source) for e in batch])}  # (B,)
    if batch[0].label >= 0:
        out["labels"] = torch.tensor([e.label for e in batch])  # (B,)
    else:
        out["tgt_in"] = pad([(bos_id, *e.target) for e in batch], pad_id)  # (B, T)
        out["tgt_out"] = pad([(*e.target, eos_id) for e in batch], pad_id)  # (B, T)
    return out


def bucketed_batches(lengths: Sequence[int], batch_size: int, chunk_batches: int,
                     generator: torch.Generator) -> list[list[int]]:
    """Shuffled index batches whose members have similar lengths.

    The data is shuffled, cut into chunks of chunk_batches * batch_size, each chunk sorted by
    length and cut into batches; the batch order is shuffled again. Deterministic for a seed.
    """
    order = torch.randperm(len(lengths), generator=generator).tolist()
    chunk = batch_size * chunk_batches
    batches: list[list[int]] = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: lengths[i])
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    shuffle = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffle]


def sorted_batches(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Evaluation batches in length order (less padding); callers restore the order."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]
