"""The resumable sampler: every sample once per epoch over all ranks, and a resume continues exactly."""

import pytest

from train.data import ResumableDistributedSampler


def epoch_order(length: int, world: int, epoch: int, start: int = 0) -> list[list[int]]:
    samplers = [ResumableDistributedSampler(length, world, rank, seed=3) for rank in range(world)]
    for sampler in samplers:
        sampler.set_epoch(epoch, start=start)
    return [list(s) for s in samplers]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_each_sample_once_per_epoch_padded_evenly(world):
    shards = epoch_order(10, world, epoch=0)
    assert len({len(s) for s in shards}) == 1
    assert set().union(*map(set, shards)) == set(range(10))


def test_epochs_differ_and_repeat_with_the_seed():
    assert epoch_order(50, 1, 0) != epoch_order(50, 1, 1)
    assert epoch_order(50, 1, 1) == epoch_order(50, 1, 1)


@pytest.mark.parametrize("world_after", [1, 2, 3])
def test_a_resume_sees_the_remaining_samples_whatever_the_world_size(world_after):
    """The position is counted over all ranks, so a run stopped with any world size resumes with any other."""
    full = epoch_order(40, 1, epoch=2)[0]
    consumed = 12  # samples over all ranks before the interruption
    resumed = epoch_order(40, world_after, epoch=2, start=consumed)
    interleaved = [i for step in zip(*resumed) for i in step][: 40 - consumed]
    assert interleaved == full[consumed:]
