"""`Accumulator`: one step's sums, minima and maxima across micro-batches, floats and tensors
mixed, with the defaults of what was never recorded."""

import math

import torch

from tokenflow.algorithms.stats import Accumulator


def test_sums_add_floats_and_tensors_and_keep_no_graph():
    acc = Accumulator()
    w = torch.tensor(2.0, requires_grad=True)
    acc.add("loss", 1.5)
    acc.add("loss", w * 1.0)
    assert acc.get("loss") == 3.5 and "loss" in acc and "other" not in acc
    assert not acc._sums["loss"].requires_grad  # recording does not hold the micro-batch's graph


def test_what_was_never_recorded_reads_as_its_default():
    acc = Accumulator()
    assert (acc.get("x"), acc.get("x", 7.0)) == (0.0, 7.0)
    assert (acc.min("x"), acc.max("x")) == (math.inf, -math.inf)
    assert (acc.min("x", 1.0), acc.max("x", 2.0)) == (1.0, 2.0)


def test_minima_and_maxima_over_floats_and_tensors():
    acc = Accumulator()
    for v in (3, 1, 2):
        acc.lo("a", v)
        acc.hi("a", v)
    assert (acc.min("a"), acc.max("a")) == (1.0, 3.0)
    # a float beside a tensor: compared in float64, so 0.1 stays 0.1 (float32 would give 0.10000000149)
    acc.lo("t", 0.1)
    acc.lo("t", torch.tensor(0.2, dtype=torch.float64))
    acc.hi("t", torch.tensor(0.2, dtype=torch.float64))
    acc.hi("t", 0.7)
    assert (acc.min("t"), acc.max("t")) == (0.1, 0.7)
    acc.lo("u", torch.tensor(0.3, dtype=torch.float64))
    acc.lo("u", 0.1)
    assert acc.min("u") == 0.1


def test_ratio_of_sums_and_its_default_when_the_denominator_is_zero():
    acc = Accumulator()
    acc.add("num", 3.0)
    acc.add("den", 4.0)
    acc.add("zero", 0.0)
    assert acc.ratio("num", "den") == 0.75
    assert acc.ratio("num", "missing") == 0.0 and acc.ratio("num", "zero", default=9.0) == 9.0


def test_merge_adds_sums_and_folds_minima_and_maxima():
    a, b = Accumulator(), Accumulator()
    a.add("x", 1.0)
    a.lo("m", 2.0)
    a.hi("M", 5.0)
    b.add("x", 2.0)
    b.add("y", 3.0)
    b.lo("m", 1.0)
    b.lo("n", 8.0)
    b.hi("M", 4.0)
    b.hi("N", -1.0)
    a.merge(b)
    assert (a.get("x"), a.get("y")) == (3.0, 3.0)
    assert (a.min("m"), a.min("n"), a.max("M"), a.max("N")) == (1.0, 8.0, 5.0, -1.0)
