"""lr schedules (optim/schedule.py): warmup, cosine to lr·min_ratio, WSD plateau and decay to 0 (docs/paper.md §3.1, §3.3)."""
import math

import pytest

from optim.config import ScheduleConfig
from optim.schedule import lr_at, wsd_decay_start

PEAK = 4e-3
TOTAL = 100


def test_warmup_is_linear_from_peak_over_warmup_to_peak():
    cfg = ScheduleConfig(name="cosine", warmup_steps=10, min_lr_ratio=0.05)
    assert lr_at(0, TOTAL, PEAK, cfg) == pytest.approx(PEAK / 10)
    assert lr_at(4, TOTAL, PEAK, cfg) == pytest.approx(PEAK * 5 / 10)
    assert lr_at(9, TOTAL, PEAK, cfg) == pytest.approx(PEAK)  # warmup end
    assert lr_at(10, TOTAL, PEAK, cfg) == pytest.approx(PEAK)  # cosine starts at the peak


def test_cosine_ends_at_min_ratio_on_the_last_step():
    cfg = ScheduleConfig(name="cosine", warmup_steps=10, min_lr_ratio=0.05)
    lrs = [lr_at(s, TOTAL, PEAK, cfg) for s in range(TOTAL)]
    assert lrs[-1] == pytest.approx(PEAK * 0.05, rel=1e-12)  # docs/paper.md §3.1: lr_max / 20
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # monotone after warmup
    mid = 10 + (TOTAL - 1 - 10) / 2  # halfway through the decay: the mean of peak and floor
    assert lr_at(int(mid), TOTAL, PEAK, cfg) == pytest.approx(PEAK * (0.05 + 0.95 * 0.5 * (1 + math.cos(
        math.pi * (int(mid) - 10) / (TOTAL - 1 - 10)))))
    assert lr_at(TOTAL + 5, TOTAL, PEAK, cfg) == pytest.approx(PEAK * 0.05)  # past the end: stays


def test_no_warmup_starts_at_peak():
    cfg = ScheduleConfig(name="cosine", warmup_steps=0, min_lr_ratio=0.1)
    assert lr_at(0, TOTAL, PEAK, cfg) == PEAK
    assert lr_at(TOTAL - 1, TOTAL, PEAK, cfg) == pytest.approx(PEAK * 0.1)


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_wsd_plateau_then_decay_to_zero(shape):
    cfg = ScheduleConfig(name="wsd", warmup_steps=10, decay_frac=0.2, decay_shape=shape)
    assert wsd_decay_start(TOTAL, 0.2) == 80  # constant until 80 % of the steps (docs/paper.md §3.3)
    assert lr_at(9, TOTAL, PEAK, cfg) == pytest.approx(PEAK)
    assert all(lr_at(s, TOTAL, PEAK, cfg) == PEAK for s in range(10, 81))  # plateau
    assert 0 < lr_at(81, TOTAL, PEAK, cfg) < PEAK
    assert lr_at(TOTAL - 1, TOTAL, PEAK, cfg) == 0.0
    decay = [lr_at(s, TOTAL, PEAK, cfg) for s in range(80, TOTAL)]
    assert all(a > b for a, b in zip(decay, decay[1:]))


def test_wsd_shapes_at_mid_decay():
    mid = 80 + (TOTAL - 1 - 80) // 2  # progress 9/19
    p = (mid - 80) / (TOTAL - 1 - 80)
    got = {s: lr_at(mid, TOTAL, PEAK, ScheduleConfig(name="wsd", decay_frac=0.2, decay_shape=s))
           for s in ("linear", "cosine", "sqrt")}
    assert got["linear"] == pytest.approx(PEAK * (1 - p))
    assert got["cosine"] == pytest.approx(PEAK * 0.5 * (1 + math.cos(math.pi * p)))
    assert got["sqrt"] == pytest.approx(PEAK * (1 - math.sqrt(p)))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="warmup_steps"):
        lr_at(0, 10, PEAK, ScheduleConfig(warmup_steps=10))
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_at(0, 10, PEAK, ScheduleConfig(name="step"))  # type: ignore[arg-type]
