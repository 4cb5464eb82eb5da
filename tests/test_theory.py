"""Theorem 2.2 (docs/paper.md §5.2) as a float64 gradient-flow simulation: a scale vector in front of a linear map makes
training strictly faster than the map alone, and γ_j² − ‖u_j‖² is conserved."""
import torch

from model.vectors import ScaleVector
from model.config import Role


def rk4(f, state, dt, steps):
    traj = [state]
    for _ in range(steps):
        k1 = f(state)
        k2 = f([s + 0.5 * dt * k for s, k in zip(state, k1)])
        k3 = f([s + 0.5 * dt * k for s, k in zip(state, k2)])
        k4 = f([s + dt * k for s, k in zip(state, k3)])
        state = [s + dt / 6 * (a + 2 * b + 2 * c + d) for s, a, b, c, d in zip(state, k1, k2, k3, k4)]
        traj.append(state)
    return traj


def test_theorem_2_2_gradient_flow():
    torch.manual_seed(0)
    c, d, dt, steps = 3, 5, 1e-3, 3000
    w_star = torch.randn(c, d, dtype=torch.float64)

    def flow_f(state):  # L_f = ½‖W diag(γ) − W*‖²: dW = R diag(γ), dγ_j = Σ_i W_ij R_ij
        w, gamma = state
        r = w_star - w * gamma
        return [r * gamma, (w * r).sum(0)]

    traj = rk4(flow_f, [torch.zeros(c, d, dtype=torch.float64), torch.ones(d, dtype=torch.float64)], dt, steps)
    for i, (w, gamma) in enumerate(traj):
        t = i * dt
        loss_f = 0.5 * (w * gamma - w_star).pow(2).sum().item()
        loss_g = 0.5 * torch.exp(torch.tensor(-2 * t)).item() * w_star.pow(2).sum().item()  # closed form for g
        if i > 0:
            assert loss_f < loss_g, f"L_f ≥ L_g at t={t}"
        invariant = gamma.pow(2) - w.pow(2).sum(0)  # γ_j² − ‖u_j‖² (docs/paper.md §5.2)
        # RK4's global error ~ t·dt⁴·C = 3e-12·C, float64 rounding ~ steps·u₆₄ ≈ 3e-13: 1e-6 is neither (a broken
        # invariant is O(1))
        assert (invariant - 1).abs().max().item() < 1e-6
    assert loss_f < 0.5 * loss_g  # by t = 3 the gap is large, not a rounding effect


def test_or_norm_of_alpha_is_conserved_under_gradient_flow():
    """docs/paper.md §5.5: under OR, ‖α‖ stays √d (the gradient of β·Norm(α) is orthogonal to α)."""
    torch.manual_seed(1)
    d = 6
    sv = ScaleVector(d, "or", Role.SCALE_INPUT).double()
    sv.reset_parameters()
    target = torch.randn(d, dtype=torch.float64)
    loss = 0.5 * (sv() * 1.3 - target).pow(2).sum()
    loss.backward()
    assert abs(torch.dot(sv.alpha.grad, sv.alpha.detach()).item()) < 1e-12  # float64, 6 terms of O(1): ~1e-15
