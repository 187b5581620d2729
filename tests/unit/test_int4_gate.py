"""--int4's accuracy gate (export/int4_gate.py): where two greedy generations first part, whether that is a
near-tie, and the verdict against the bounds, with by how much it missed."""

from __future__ import annotations

import numpy as np

from export.int4_gate import GateReport, Int4Gate, first_difference, judge


def logits_choosing(token: int, runner_up: int, vocab: int = 10) -> np.ndarray:
    row = np.zeros(vocab)
    row[token], row[runner_up] = 2.0, 1.9
    return row


def test_agreement_runs_to_the_first_difference_and_says_if_it_is_a_near_tie():
    tokens = [1, 2, 3, 4]
    fp32 = [logits_choosing(t, 9) for t in tokens]
    same = [logits_choosing(t, 9) for t in tokens]
    assert first_difference(tokens, fp32, same) == (4, True)
    near = [logits_choosing(1, 9), logits_choosing(5, 2), *same[2:]]  # int4 prefers 5; fp32's 2 is its runner-up
    fp32_with_5 = [fp32[0], logits_choosing(2, 5), *fp32[2:]]
    assert first_difference(tokens, fp32_with_5, near) == (1, True)
    far = [logits_choosing(1, 9), logits_choosing(7, 8), *same[2:]]  # fp32's 2 is nowhere near int4's top
    far[1][2] = -5.0
    assert first_difference(tokens, fp32, far) == (1, False)


def test_the_verdict_names_the_first_bound_missed_and_by_how_much():
    good = GateReport(
        prompts=2, tokens=40, agreed=30, first_differences=2, near_ties=2, loglik_fp32=-1.0, loglik_int4=-1.05
    )
    assert judge(good, Int4Gate()).passed
    low = judge(GateReport(**{**vars(good), "agreed": 10}), Int4Gate())
    assert not low.passed and "25.0% of the time, below the gate's 40% by 15.0%" in str(low.reason)
    far = judge(GateReport(**{**vars(good), "near_ties": 1}), Int4Gate())
    assert not far.passed and "1 of 2 first differences are not near-ties" in str(far.reason)
    drop = judge(GateReport(**{**vars(good), "loglik_int4": -1.3}), Int4Gate())
    assert not drop.passed and "drops by 0.300 nats a token" in str(drop.reason) and "by 0.200" in str(drop.reason)
    assert not judge(GateReport(), Int4Gate()).passed
