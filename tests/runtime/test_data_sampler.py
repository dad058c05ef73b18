"""ResumableDistributedSampler: same order as DistributedSampler, exact position across epochs
and across a DataLoader that prefetches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from orchestrator.runtime.data import ResumableDistributedSampler


class Indices(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), world=st.integers(1, 5), epoch=st.integers(0, 3), drop_last=st.booleans(),
       shuffle=st.booleans(), data=st.data())
def test_same_order_as_torch_distributed_sampler(n, world, epoch, drop_last, shuffle, data) -> None:
    if drop_last and n < world:
        return
    rank = data.draw(st.integers(0, world - 1))
    ref: DistributedSampler[int] = DistributedSampler(Indices(n), num_replicas=world, rank=rank, shuffle=shuffle,
                                                      seed=7, drop_last=drop_last)
    ours = ResumableDistributedSampler(n, num_replicas=world, rank=rank, shuffle=shuffle, seed=7, drop_last=drop_last)
    ref.set_epoch(epoch)
    ours.set_epoch(epoch)
    assert list(ours) == list(ref)
    assert len(ours) == len(ref)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 40), consumed=st.integers(0, 200))
def test_state_round_trip_across_epochs(n, consumed) -> None:
    """Consume `consumed` samples over as many epochs as it takes, checkpoint, restore into a fresh
    sampler: the rest of the stream equals the uninterrupted one."""
    def stream(s: ResumableDistributedSampler, count: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        while len(out) < count:
            it = iter(s)
            for i in it:
                out.append((s.epoch, i))
                s.advance(1)
                if len(out) == count:
                    break
            if s.exhausted:
                s.set_epoch(s.epoch + 1)
        return out

    a = ResumableDistributedSampler(n, num_replicas=2, rank=1, seed=5)
    first = stream(a, consumed)
    state = a.state_dict()
    rest_uninterrupted = stream(a, 30)
    b = ResumableDistributedSampler(n, num_replicas=2, rank=1, seed=5)
    b.load_state_dict(state)
    b.set_epoch(state["epoch"])          # the usual top-of-epoch call keeps the position
    assert stream(b, 30) == rest_uninterrupted
    assert len(first) == consumed


@pytest.mark.parametrize("num_workers", [0, 2])
def test_position_counts_consumed_not_prefetched(num_workers: int) -> None:
    def loader(s: ResumableDistributedSampler) -> DataLoader:
        return DataLoader(Indices(23), batch_size=3, sampler=s, num_workers=num_workers,
                          prefetch_factor=4 if num_workers else None, generator=torch.Generator().manual_seed(0))

    full = ResumableDistributedSampler(23, num_replicas=2, rank=0, seed=1)
    reference = [b.tolist() for b in loader(full)]

    s = ResumableDistributedSampler(23, num_replicas=2, rank=0, seed=1)
    it = iter(loader(s))
    seen = []
    for _ in range(2):                   # the workers have prefetched far more than 2 batches
        batch = next(it)
        s.advance(len(batch))
        seen.append(batch.tolist())
    state = s.state_dict()
    del it
    assert state["position"] == 6
    resumed = ResumableDistributedSampler(23, num_replicas=2, rank=0, seed=1)
    resumed.load_state_dict(state)
    seen += [b.tolist() for b in loader(resumed)]
    assert seen == reference


def test_set_epoch_resets_only_on_change_and_advance_guards_overrun() -> None:
    s = ResumableDistributedSampler(10, num_replicas=2, rank=0)
    s.advance(3)
    s.set_epoch(0)
    assert s.position == 3 and len(s) == 2
    s.set_epoch(1)
    assert (s.epoch, s.position) == (1, 0)
    with pytest.raises(ValueError, match="overruns"):
        s.advance(6)


def test_world_size_change_rescales_and_dataset_change_is_refused() -> None:
    s = ResumableDistributedSampler(40, num_replicas=4, rank=0)
    s.load_state_dict({"epoch": 2, "position": 5, "world_size": 2, "dataset_len": 40})
    assert (s.epoch, s.position) == (2, 2)     # 10 consumed in total -> 2 (floor) per rank of 4
    with pytest.raises(ValueError, match="dataset of 41"):
        s.load_state_dict({"epoch": 0, "position": 0, "world_size": 4, "dataset_len": 41})
    with pytest.raises(ValueError, match="rank"):
        ResumableDistributedSampler(4, num_replicas=2, rank=2)
