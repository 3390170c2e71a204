"""PPO value clipping with numbers worked by hand: the clipped prediction
V_old + clip(V − V_old, −c, c) counts where its error is the larger one."""

import torch

from tokenflow.algorithms.losses import value_loss


def test_value_clipping_takes_the_larger_of_the_plain_and_clipped_errors():
    v, old, ret = torch.tensor([0.0, 2.0, 0.25]), torch.tensor([1.0, 0.0, 0.0]), torch.tensor([-1.0, 0.0, 1.0])
    # token 0: V moved −1 from 1, clipped to −0.5 → 0.5; errors (0 + 1)² = 1 and (0.5 + 1)² = 2.25 → 1.125
    # token 1: V moved +2 from 0, clipped to 0.5; errors 4 and 0.25 → 2
    # token 2: inside the range (+0.25): both errors 0.5625 → 0.28125
    assert value_loss(v, old, ret, clip=0.5).tolist() == [1.125, 2.0, 0.28125]
    assert value_loss(v, old, ret).tolist() == [0.5, 2.0, 0.28125]


def test_ppo_clip_is_active_only_on_the_side_the_advantage_pushes():
    from tokenflow.algorithms.losses import ppo_clip

    r = torch.tensor([0.25, 0.25, 0.25, 4.0])
    adv = torch.tensor([0.0, 0.5, -1.0, 1.0])
    # a zero advantage clips nothing; a positive one only above 1 + ε_high; a negative one below 1 − ε_low
    _, active = ppo_clip(torch.log(r), torch.zeros(4), adv, 0.2, 0.2)
    assert active.tolist() == [False, False, True, True]


def test_a_ratio_on_the_clip_bound_is_not_clipped():
    from tokenflow.algorithms.losses import cispo, ppo_clip

    # ε = 0: the bound is ρ = 1 exactly (log-ratio 0)
    _, active = ppo_clip(torch.zeros(2), torch.zeros(2), torch.tensor([-1.0, 1.0]), 0.0, 0.0)
    assert active.tolist() == [False, False]
    _, clipped = cispo(torch.zeros(1), torch.zeros(1), torch.ones(1), 0.0, 0.0)
    assert clipped.tolist() == [False]


def test_the_log_ratio_is_clamped_to_plus_and_minus_twenty_and_a_zero_advantage_clips_nothing():
    from tokenflow.algorithms.losses import log_ratio, ppo_clip

    assert log_ratio(torch.tensor([30.0, -30.0, 1.0]), torch.zeros(3)).tolist() == [20.0, -20.0, 1.0]
    _, active = ppo_clip(torch.log(torch.tensor([4.0])), torch.zeros(1), torch.zeros(1), 0.2, 0.2)
    assert active.tolist() == [False]  # ρ = 4 above 1 + ε, but no advantage pushes it
