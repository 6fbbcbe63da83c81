"""Every loss of ``fl_lightning.core.losses`` against a direct computation, hand-worked numbers, and its defining
properties.

The direct computations loop over samples and classes in float64 numpy / plain Python, written independently of the
vectorised torch implementation (no masking tricks, no gathers).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_lightning.core import losses as L

C = 5


# ----------------------------------------------------------------------------------------------------------- helpers
def np_softmax(values, tau=1.0):
    v = np.asarray(values, dtype=np.float64) / tau
    e = np.exp(v - v.max())
    return e / e.sum()


def kl(p, q):
    """Σ p log(p/q) with 0 log 0 = 0, by a Python loop."""
    total = 0.0
    for pi, qi in zip(p, q, strict=True):
        if pi > 0:
            total += pi * math.log(pi / qi)
    return total


def rows(t):
    return t.detach().double().numpy()


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(8, C, generator=g) * 2
    zg = torch.randn(8, C, generator=g) * 2
    y = torch.tensor([0, 1, 2, 3, 4, 0, 3, 1])
    return z, zg, y


MAJORITIES = [
    [True, False, False, True, False],
    [False, False, False, False, False],
    [True, True, True, True, False],
    [True, True, True, True, True],
]


# ---------------------------------------------------------------------------------------------------------------- KD
class TestKD:
    @pytest.mark.parametrize("tau", [1.0, 3.0])
    def test_matches_kl_div(self, batch, tau):
        z, zg, _ = batch
        expected = F.kl_div(F.log_softmax(z / tau, 1), F.softmax(zg / tau, 1), reduction="batchmean") * tau**2
        torch.testing.assert_close(L.kd_loss(z, zg, tau=tau), expected)

    def test_direct(self, batch):
        z, zg, _ = batch
        total = sum(kl(np_softmax(b, 2.0), np_softmax(a, 2.0)) for a, b in zip(rows(z), rows(zg), strict=True))
        assert L.kd_loss(z, zg, 2.0).item() == pytest.approx(4.0 * total / len(z), rel=1e-5)

    def test_hand_worked(self):
        # p = softmax_g([0, ln 3]) = [1/4, 3/4], q = softmax([0, 0]) = [1/2, 1/2]
        # KL(p || q) = 1/4 ln(1/2) + 3/4 ln(3/2) = -0.173287 + 0.304099 = 0.130812
        z, zg = torch.zeros(1, 2), torch.tensor([[0.0, math.log(3)]])
        assert L.kd_loss(z, zg).item() == pytest.approx(0.130812, abs=1e-6)
        # τ = 2 with doubled logits gives the same distributions, times τ² = 4
        assert L.kd_loss(2 * z, 2 * zg, tau=2.0).item() == pytest.approx(4 * 0.130812, abs=1e-5)

    def test_zero_at_teacher_and_teacher_is_constant(self, batch):
        z, zg, _ = batch
        assert L.kd_loss(z, z).item() == pytest.approx(0.0, abs=1e-6)
        zg = zg.clone().requires_grad_(True)
        z = z.clone().requires_grad_(True)
        L.kd_loss(z, zg).backward()
        assert zg.grad is None and z.grad is not None

    def test_rejects_bad_tau(self, batch):
        z, zg, _ = batch
        with pytest.raises(ValueError, match="tau"):
            L.kd_loss(z, zg, tau=0.0)


# ------------------------------------------------------------------------------------------------------------ FedNTD
class TestNTD:
    @pytest.mark.parametrize("tau", [1.0, 2.0])
    def test_direct(self, batch, tau):
        z, zg, y = batch
        total = 0.0
        for zi, zgi, yi in zip(rows(z), rows(zg), y.tolist(), strict=True):
            zi_nt = [zi[c] for c in range(C) if c != yi]
            zgi_nt = [zgi[c] for c in range(C) if c != yi]
            total += kl(np_softmax(zgi_nt, tau), np_softmax(zi_nt, tau))
        assert L.ntd_loss(z, zg, y, tau).item() == pytest.approx(tau**2 * total / len(y), rel=1e-5)

    def test_hand_worked(self):
        # y = 0, dropped. Not-true logits: z -> [0, 0], q = [1/2, 1/2]; z_g -> [0, ln 3], p = [1/4, 3/4].
        # KL = 1/4 ln(1/2) + 3/4 ln(3/2) = 0.130812 (the true-class logits 9 and -4 play no part)
        z = torch.tensor([[9.0, 0.0, 0.0]])
        zg = torch.tensor([[-4.0, 0.0, math.log(3)]])
        assert L.ntd_loss(z, zg, torch.tensor([0])).item() == pytest.approx(0.130812, abs=1e-6)
        # y = 2 instead: not-true z = [9, 0] vs z_g = [-4, 0], a different, larger value
        assert L.ntd_loss(z, zg, torch.tensor([2])).item() > 1.0

    def test_true_class_gets_exactly_zero_gradient(self, batch):
        z, zg, y = batch
        z = z.clone().requires_grad_(True)
        L.ntd_loss(z, zg, y, tau=3.0).backward()
        for i, yi in enumerate(y.tolist()):
            assert z.grad[i, yi].item() == 0.0
            assert z.grad[i, [c for c in range(C) if c != yi]].abs().sum() > 0

    def test_true_class_logits_do_not_matter(self, batch):
        z, zg, y = batch
        z2, zg2 = z.clone(), zg.clone()
        z2[torch.arange(len(y)), y] += 50.0
        zg2[torch.arange(len(y)), y] -= 50.0
        torch.testing.assert_close(L.ntd_loss(z, zg, y), L.ntd_loss(z2, zg2, y))

    @pytest.mark.parametrize("scale", [1e4, 1e30])
    def test_finite_with_huge_logits(self, scale):
        z = torch.tensor([[scale, -scale, 0.0], [0.0, scale, -scale]], requires_grad=True)
        zg = torch.tensor([[-scale, scale, 5.0], [scale, -scale, scale]])
        out = L.ntd_loss(z, zg, torch.tensor([0, 1]))
        out.backward()
        assert torch.isfinite(out) and torch.isfinite(z.grad).all()


# ------------------------------------------------------------------------------------------------------------ FedLMD
def lmd_direct(z, zg, y, majority, tau=1.0):
    total = 0.0
    for zi, zgi, yi in zip(rows(z), rows(zg), y.tolist(), strict=True):
        teacher = [c for c in range(C) if c != yi and not majority[c]]
        student = [c for c in range(C) if c != yi]
        if not teacher:
            continue  # zero term, still counted in the mean
        p = dict(zip(teacher, np_softmax([zgi[c] for c in teacher], tau), strict=True))
        q = dict(zip(student, np_softmax([zi[c] for c in student], tau), strict=True))
        total += sum(p[c] * math.log(p[c] / q[c]) for c in teacher)
    return tau**2 * total / len(y)


class TestLMD:
    def test_majority_rule(self):
        # n_k = 10, C = 4, mean 2.5: strictly more than the mean is majority
        assert L.majority_mask(torch.tensor([5, 2, 0, 3])).tolist() == [True, False, False, True]
        # exactly the mean is not majority
        assert L.majority_mask(torch.tensor([2, 2, 2, 2])).tolist() == [False] * 4
        # sharding s = 2: both held classes are majority labels
        assert L.majority_mask(torch.tensor([0, 250, 0, 0, 250, 0, 0, 0, 0, 0])).tolist() == [
            c in (1, 4) for c in range(10)
        ]

    @pytest.mark.parametrize("majority", MAJORITIES)
    @pytest.mark.parametrize("tau", [1.0, 2.0])
    def test_direct(self, batch, majority, tau):
        z, zg, y = batch
        out = L.lmd_loss(z, zg, y, torch.tensor(majority), tau)
        assert out.item() == pytest.approx(lmd_direct(z, zg, y, majority, tau), rel=1e-5, abs=1e-7)

    def test_hand_worked(self):
        # C = 4, y = 0, majority = {1}. Teacher keeps {2, 3}: z_g[2:] = [0, ln 3] -> p' = [0, 0, 1/4, 3/4].
        # Student over {1, 2, 3}: z[1:] = [0, 0, 0] -> p'_k = [0, 1/3, 1/3, 1/3].
        # KL = 1/4 ln((1/4)/(1/3)) + 3/4 ln((3/4)/(1/3)) = 1/4 ln(3/4) + 3/4 ln(9/4) = -0.071921 + 0.608198 = 0.536277
        z = torch.tensor([[7.0, 0.0, 0.0, 0.0]])
        zg = torch.tensor([[3.0, 9.0, 0.0, math.log(3)]])
        out = L.lmd_loss(z, zg, torch.tensor([0]), torch.tensor([False, True, False, False]))
        assert out.item() == pytest.approx(0.536277, abs=1e-6)

    def test_majority_masked_in_teacher(self, batch):
        z, zg, y = batch
        majority = torch.tensor([True, False, False, True, False])
        zg2 = zg.clone()
        zg2[:, majority] += torch.tensor([7.0, -30.0])
        torch.testing.assert_close(L.lmd_loss(z, zg, y, majority), L.lmd_loss(z, zg2, y, majority))

    def test_true_class_masked_in_teacher(self, batch):
        z, zg, y = batch
        majority = torch.tensor([False, False, True, False, False])
        zg2 = zg.clone()
        zg2[torch.arange(len(y)), y] += 40.0
        torch.testing.assert_close(L.lmd_loss(z, zg, y, majority), L.lmd_loss(z, zg2, y, majority))

    def test_true_class_masked_in_student(self, batch):
        z, zg, y = batch
        majority = torch.tensor([False, False, True, False, False])
        z = z.clone().requires_grad_(True)
        L.lmd_loss(z, zg, y, majority).backward()
        assert torch.all(z.grad[torch.arange(len(y)), y] == 0)
        z2 = z.detach().clone()
        z2[torch.arange(len(y)), y] -= 25.0
        torch.testing.assert_close(L.lmd_loss(z.detach(), zg, y, majority), L.lmd_loss(z2, zg, y, majority))

    def test_finite_when_y_is_minority(self):
        # y = 1 is a minority label: a teacher that put mass on it would make the KL infinite
        z = torch.tensor([[0.0, -50.0, 1.0, 2.0]], requires_grad=True)
        zg = torch.tensor([[0.0, 30.0, 1.0, 0.0]])
        majority = torch.tensor([True, False, False, False])
        out = L.lmd_loss(z, zg, torch.tensor([1]), majority)
        out.backward()
        assert torch.isfinite(out) and torch.isfinite(z.grad).all()
        # by hand: teacher over {2, 3} = softmax([1, 0]); student over {0, 2, 3} = softmax([0, 1, 2])
        p = np_softmax([1.0, 0.0])
        q = np_softmax([0.0, 1.0, 2.0])[1:]
        assert out.item() == pytest.approx(kl(p, q), rel=1e-6)

    def test_zero_when_every_other_class_is_majority(self):
        majority = torch.tensor([True, True, False])
        z = torch.randn(1, 3, requires_grad=True)
        out = L.lmd_loss(z, torch.randn(1, 3), torch.tensor([2]), majority)
        out.backward()
        assert out.item() == 0.0 and torch.all(z.grad == 0)
        # in a batch, that sample contributes 0 but still counts in the mean
        z2 = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
        zg2 = torch.tensor([[0.0, 0.0, 5.0], [4.0, 0.0, 1.0]])
        both = L.lmd_loss(z2, zg2, torch.tensor([0, 2]), majority)
        first = L.lmd_loss(z2[:1], zg2[:1], torch.tensor([0]), majority)
        assert both.item() == pytest.approx(first.item() / 2)

    def test_finite_with_huge_logits(self):
        z = torch.tensor([[1e30, -1e30, 0.0, 1e4]], requires_grad=True)
        out = L.lmd_loss(z, torch.tensor([[-1e30, 1e30, 1e4, 0.0]]), torch.tensor([0]), torch.tensor([0, 1, 0, 0]) > 0)
        out.backward()
        assert torch.isfinite(out) and torch.isfinite(z.grad).all()


class TestLMDTf:
    @pytest.mark.parametrize("majority", MAJORITIES)
    def test_target_sums_to_one_over_unmasked(self, batch, majority):
        _, _, y = batch
        target = L.lmd_tf_target(y, torch.tensor(majority), C)
        assert target.shape == (len(y), C) and target.dtype == torch.float32
        for i, yi in enumerate(y.tolist()):
            allowed = [c for c in range(C) if c != yi and not majority[c]]
            masked = [c for c in range(C) if c not in allowed]
            if allowed:
                assert target[i, allowed].sum().item() == pytest.approx(1.0)
                assert torch.allclose(target[i, allowed], torch.full((len(allowed),), 1 / len(allowed)))
            assert torch.all(target[i, masked] == 0)

    @pytest.mark.parametrize("majority", MAJORITIES)
    def test_loss_direct(self, batch, majority):
        z, _, y = batch
        total = 0.0
        for zi, yi in zip(rows(z), y.tolist(), strict=True):
            allowed = [c for c in range(C) if c != yi and not majority[c]]
            student = [c for c in range(C) if c != yi]
            q = dict(zip(student, np_softmax([zi[c] for c in student], 2.0), strict=True))
            total += sum((1 / len(allowed)) * math.log((1 / len(allowed)) / q[c]) for c in allowed)
        out = L.lmd_tf_loss(z, y, torch.tensor(majority), tau=2.0)
        assert out.item() == pytest.approx(4.0 * total / len(y), rel=1e-5, abs=1e-7)

    def test_hand_worked(self):
        # C = 4, y = 0, majority = {1}: μ = [0, 0, 1/2, 1/2]; student over {1, 2, 3} uniform: 1/3 each.
        # KL = 2 · 1/2 · ln((1/2)/(1/3)) = ln(3/2) = 0.405465
        out = L.lmd_tf_loss(torch.tensor([[5.0, 1.0, 1.0, 1.0]]), torch.tensor([0]), torch.tensor([0, 1, 0, 0]) > 0)
        assert out.item() == pytest.approx(0.405465, abs=1e-6)

    @pytest.mark.parametrize("majority", MAJORITIES)
    def test_equals_lmd_with_a_flat_teacher(self, batch, majority):
        z, _, y = batch
        m = torch.tensor(majority)
        torch.testing.assert_close(L.lmd_tf_loss(z, y, m), L.lmd_loss(z, torch.zeros_like(z), y, m))

    def test_true_class_gets_zero_gradient(self, batch):
        z, _, y = batch
        z = z.clone().requires_grad_(True)
        L.lmd_tf_loss(z, y, torch.tensor(MAJORITIES[0])).backward()
        assert torch.all(z.grad[torch.arange(len(y)), y] == 0) and torch.isfinite(z.grad).all()


# ------------------------------------------------------------------------------------------------------------ FedSSD
def credibility_direct(a_rows):
    a = np.asarray(a_rows, dtype=np.float64)
    m_class = []
    for k in range(a.shape[0]):
        worst = max((a[j, k] for j in range(a.shape[0]) if j != k), default=0.0)
        m_class.append(a[k, k] * (1 - worst))
    return m_class


class TestSSD:
    def test_credibility_hand_worked(self):
        preds, targets = torch.tensor([0, 1, 1, 2, 2, 2]), torch.tensor([0, 0, 1, 1, 2, 2])
        a = L.credibility_matrix(preds, targets, 3)
        assert a.tolist() == [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]]

    def test_credibility_direct_rows_sum_to_one(self):
        g = torch.Generator().manual_seed(1)
        targets = torch.randint(0, 4, (60,), generator=g)  # class 4 has no sample
        preds = torch.randint(0, C, (60,), generator=g)
        a = L.credibility_matrix(preds, targets, C)
        for k1 in range(C):
            n = sum(1 for t in targets.tolist() if t == k1)
            for k2 in range(C):
                hits = sum(1 for t, p in zip(targets.tolist(), preds.tolist(), strict=True) if t == k1 and p == k2)
                assert a[k1, k2].item() == pytest.approx(hits / n if n else 0.0)
        torch.testing.assert_close(a.sum(1)[:4], torch.ones(4))
        assert torch.all(a[4] == 0)

    def test_weights_direct_and_bounds(self, batch):
        _, zg, y = batch
        a = torch.tensor(
            [
                [0.9, 0.05, 0.05, 0, 0],
                [0.1, 0.8, 0.1, 0, 0],
                [0, 0, 1, 0, 0],
                [0, 0, 0, 0.95, 0.05],
                [0, 0, 0, 0.3, 0.7],
            ]
        )
        m = L.ssd_weights(zg * 3, y, a, m_max=0.01)
        m_class = credibility_direct(a.tolist())
        for i, yi in enumerate(y.tolist()):
            p_true = np_softmax(rows(zg[i] * 3))[yi]
            m_sample = 1 - math.sqrt(1 - p_true)
            for k in range(C):
                assert m[i, k].item() == pytest.approx(0.01 * max(0.0, m_class[k] * m_sample - 0.1), rel=1e-4, abs=1e-9)
        assert m.min() >= 0 and m.max() <= 0.01 and m.max() > 0

    @pytest.mark.parametrize("seed", range(3))
    def test_weights_bounded_for_random_credibility(self, seed):
        g = torch.Generator().manual_seed(seed)
        a = L.credibility_matrix(torch.randint(0, C, (200,), generator=g), torch.randint(0, C, (200,), generator=g), C)
        zg = torch.randn(16, C, generator=g) * 10
        m = L.ssd_weights(zg, torch.randint(0, C, (16,), generator=g), a, m_max=0.001)
        assert m.shape == (16, C) and m.dtype == torch.float32
        assert m.min() >= 0 and m.max() <= 0.001

    def test_weights_hand_worked(self):
        # A = [[0.8, 0.2], [0.4, 0.6]]: M_class = [0.8 · (1 − 0.4), 0.6 · (1 − 0.2)] = [0.48, 0.48]
        # z_g = [ln 3, 0] -> p_g = [3/4, 1/4]; y = 0: M_sample = 1 − (1/4)^0.5 = 1/2
        # M = m_max · max(0, 0.48 · 0.5 − 0.1) = 0.14 · m_max
        m = L.ssd_weights(
            torch.tensor([[math.log(3), 0.0]]), torch.tensor([0]), torch.tensor([[0.8, 0.2], [0.4, 0.6]]), 1.0
        )
        torch.testing.assert_close(m, torch.tensor([[0.14, 0.14]]))

    def test_weights_carry_no_gradient(self, batch):
        _, zg, y = batch
        zg = zg.clone().requires_grad_(True)
        a = torch.eye(C).requires_grad_(True)
        m = L.ssd_weights(zg, y, a, 0.01)
        assert not m.requires_grad and m.grad_fn is None

    def test_loss_direct(self, batch):
        z, zg, y = batch
        m = L.ssd_weights(zg, y, torch.eye(C), 0.5)
        expected = 0.0
        for i in range(len(y)):
            for k in range(C):
                mk = float(m[i, k])
                expected += (mk * float(zg[i, k]) - mk * float(z[i, k])) ** 2
        assert L.ssd_loss(z, zg, m).item() == pytest.approx(expected / len(y), rel=1e-5)

    def test_loss_hand_worked_and_zero_at_teacher(self, batch):
        # M = [0.5, 2]: (0.5·(3 − 1))² + (2·(0 − 1))² = 1 + 4 = 5
        out = L.ssd_loss(torch.tensor([[1.0, 1.0]]), torch.tensor([[3.0, 0.0]]), torch.tensor([[0.5, 2.0]]))
        assert out.item() == pytest.approx(5.0)
        z, zg, y = batch
        m = L.ssd_weights(zg, y, torch.eye(C), 0.5)
        assert L.ssd_loss(zg, zg, m).item() == 0.0

    def test_loss_gradient_only_to_student(self, batch):
        z, zg, _ = batch
        z, zg = z.clone().requires_grad_(True), zg.clone().requires_grad_(True)
        m = torch.full((len(z), C), 0.3)
        L.ssd_loss(z, zg, m).backward()
        assert zg.grad is None
        torch.testing.assert_close(z.grad, 2 * 0.09 * (z - zg).detach() / len(z))


# ------------------------------------------------------------------------------------------------------------ FedCAD
class TestCAD:
    def test_alpha_direct_and_bounds(self, batch):
        _, zg, y = batch
        alpha = L.cad_class_weights(zg, y, C, beta=0.25, gamma=0.5)
        for c in range(C):
            phis = []
            for i, yi in enumerate(y.tolist()):
                if yi == c:
                    p = np_softmax(rows(zg[i]))
                    phis.append(p[c] - sum(p[k] for k in range(C) if k != c))
            assert alpha[c].item() == pytest.approx(0.5 * 0.25 * np.mean(phis) + 0.5 * 0.75, abs=1e-6)
        assert alpha.min() >= 0.25 and alpha.max() <= 0.5

    def test_alpha_hand_worked_and_absent_class(self):
        # C = 3; class 0 samples: p_g = [3/4, 1/8, 1/8] -> φ = 3/4 − 1/4 = 1/2, twice; class 1 and 2 absent.
        # α_0 = ½(0.5 − 0.25)·½ + ½(0.75) = 0.0625 + 0.375 = 0.4375; absent classes get β = 0.25
        zg = torch.tensor([[math.log(6), 0.0, 0.0]] * 2)
        alpha = L.cad_class_weights(zg, torch.tensor([0, 0]), 3)
        torch.testing.assert_close(alpha, torch.tensor([0.4375, 0.25, 0.25]))

    def test_alpha_bounds_at_extremes(self):
        zg = torch.tensor([[100.0, -100.0], [100.0, -100.0]])
        alpha = L.cad_class_weights(zg, torch.tensor([0, 1]), 2, beta=0.1, gamma=0.9)
        torch.testing.assert_close(alpha, torch.tensor([0.9, 0.1]))

    def test_loss_direct(self, batch):
        z, zg, y = batch
        alpha = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
        total = 0.0
        for zi, zgi, yi in zip(rows(z), rows(zg), y.tolist(), strict=True):
            ce = -math.log(np_softmax(zi)[yi])
            pt, qt = np_softmax(zgi, 2.0), np_softmax(zi, 2.0)
            soft = -sum(pt[k] * math.log(qt[k]) for k in range(C))
            a = float(alpha[yi])
            total += (1 - a) * ce + a * soft
        assert L.cad_loss(z, zg, y, alpha, tau=2.0).item() == pytest.approx(total / len(y), rel=1e-5)

    def test_loss_hand_worked(self):
        # z = [ln 2, 0, 0] -> softmax [1/2, 1/4, 1/4]; y = 0: CE = ln 2.
        # z_g = 0 -> uniform teacher: L_d = −⅓(ln ½ + 2 ln ¼) = (5/3) ln 2. α_0 = 0.4:
        # 0.6 ln 2 + 0.4 · (5/3) ln 2 = (19/15) ln 2 = 0.877987
        out = L.cad_loss(
            torch.tensor([[math.log(2), 0.0, 0.0]]), torch.zeros(1, 3), torch.tensor([0]), torch.tensor([0.4, 0, 0])
        )
        assert out.item() == pytest.approx(0.877987, abs=1e-6)

    def test_zero_alpha_is_fedavg(self, batch):
        z, zg, y = batch
        alpha = L.cad_class_weights(zg, y, C, beta=0.0, gamma=0.0)
        assert torch.all(alpha == 0)
        torch.testing.assert_close(L.cad_loss(z, zg, y, alpha), F.cross_entropy(z, y))

    @pytest.mark.parametrize("c", [0.3, 1.0])
    def test_constant_alpha_is_lsd(self, batch, c):
        z, zg, y = batch
        alpha = L.cad_class_weights(zg, y, C, beta=c, gamma=c)
        torch.testing.assert_close(alpha, torch.full((C,), c))
        soft = -(F.softmax(zg / 2, 1) * F.log_softmax(z / 2, 1)).sum(1).mean()
        torch.testing.assert_close(L.cad_loss(z, zg, y, alpha, tau=2.0), (1 - c) * F.cross_entropy(z, y) + c * soft)

    def test_alpha_and_teacher_get_no_gradient(self, batch):
        z, zg, y = batch
        zg = zg.clone().requires_grad_(True)
        alpha = L.cad_class_weights(zg, y, C)
        assert not alpha.requires_grad
        L.cad_loss(z.clone().requires_grad_(True), zg, y, alpha).backward()
        assert zg.grad is None


# ------------------------------------------------------------------------------------------------------------- FedKA
class TestKA:
    def test_groups_hand_worked(self):
        # n = 100, γ = 0.05: f = [0, 0.01, 0.1, 0.4, 0.49]; f = γ exactly is dominant
        missing, non_dom, dom = L.ka_class_groups(torch.tensor([0, 1, 10, 40, 49]), gamma=0.05)
        assert missing.tolist() == [True, False, False, False, False]
        assert non_dom.tolist() == [False, True, False, False, False]
        assert dom.tolist() == [False, False, True, True, True]
        _, non_dom, dom = L.ka_class_groups(torch.tensor([5, 95]), gamma=0.05)
        assert dom.tolist() == [True, True] and non_dom.tolist() == [False, False]

    @pytest.mark.parametrize("seed", range(5))
    def test_groups_partition_the_classes(self, seed):
        g = torch.Generator().manual_seed(seed)
        counts = torch.randint(0, 4, (10,), generator=g) * torch.randint(0, 30, (10,), generator=g)
        gamma = 1 / 20
        missing, non_dom, dom = L.ka_class_groups(counts, gamma)
        assert torch.all(missing.int() + non_dom.int() + dom.int() == 1)
        n = counts.sum().item()
        for c, nc in enumerate(counts.tolist()):
            f = nc / n
            assert (missing[c].item(), non_dom[c].item(), dom[c].item()) == (f == 0, 0 < f < gamma, f >= gamma)

    def test_loss_direct(self, batch):
        z, zg, _ = batch
        dominant = [False, True, False, True, False]
        total = 0.0
        for zi, zgi in zip(rows(z), rows(zg), strict=True):
            total += sum((zgi[c] - zi[c]) ** 2 for c in range(C) if not dominant[c])
        assert L.ka_loss(z, zg, torch.tensor(dominant)).item() == pytest.approx(total / len(z), rel=1e-5)

    def test_loss_ignores_dominant_logits(self, batch):
        z, zg, _ = batch
        dominant = torch.tensor([False, True, True, False, False])
        z2, zg2 = z.clone(), zg.clone()
        z2[:, dominant] += 100.0
        zg2[:, dominant] = float("inf")
        torch.testing.assert_close(L.ka_loss(z, zg, dominant), L.ka_loss(z2, zg2, dominant))
        z = z.clone().requires_grad_(True)
        L.ka_loss(z, zg2, dominant).backward()
        assert torch.all(z.grad[:, dominant] == 0) and torch.isfinite(z.grad).all()

    def test_hand_worked(self):
        z, zg = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
        # class 1 dominant: sample 1 -> 0² + 3² = 9, sample 2 -> 1² + 1² = 2; mean 5.5
        assert L.ka_loss(z, zg, torch.tensor([False, True, False])).item() == pytest.approx(5.5)

    def test_empty_anchor_set(self):
        z = torch.zeros(0, 3, requires_grad=True)
        out = L.ka_loss(z, torch.zeros(0, 3), torch.zeros(3, dtype=torch.bool))
        assert out.item() == 0.0 and out.dtype == torch.float32
        out.backward()  # still part of the graph


# --------------------------------------------------------------------------------------------------------- baselines
class TestProx:
    def test_direct(self):
        g = torch.Generator().manual_seed(2)
        w = [torch.randn(3, 4, generator=g), torch.randn(4, generator=g)]
        wg = [torch.randn(3, 4, generator=g), torch.randn(4, generator=g)]
        expected = sum(
            float(((a.double().numpy() - b.double().numpy()) ** 2).sum()) for a, b in zip(w, wg, strict=True)
        )
        assert L.prox_term(w, wg).item() == pytest.approx(expected, rel=1e-6)

    def test_hand_worked_and_gradient(self):
        w = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([[3.0]], requires_grad=True)]
        wg = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
        out = L.prox_term(w, wg)
        assert out.item() == pytest.approx(1 + 4 + 4)
        out.backward()
        assert w[0].grad.tolist() == [2.0, 4.0] and w[1].grad.tolist() == [[4.0]]

    def test_length_mismatch(self):
        with pytest.raises(ValueError):
            L.prox_term([torch.zeros(1)], [])


class TestMoon:
    def test_direct(self, batch):
        h, hg, _ = batch
        hp = torch.roll(hg, 1, dims=0) + h
        total = 0.0
        for a, b, c in zip(rows(h), rows(hg), rows(hp), strict=True):
            sim_g = float(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))
            sim_p = float(a @ c) / (np.linalg.norm(a) * np.linalg.norm(c))
            total += -math.log(math.exp(sim_g / 0.5) / (math.exp(sim_g / 0.5) + math.exp(sim_p / 0.5)))
        assert L.moon_loss(h, hg, hp, 0.5).item() == pytest.approx(total / len(h), rel=1e-5)

    def test_hand_worked(self):
        # sim(h, h_g) = 1 (parallel), sim(h, h_prev) = 0 (orthogonal), τ = 0.5:
        # −log(e² / (e² + 1)) = log(1 + e^−2) = 0.126928
        out = L.moon_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[3.0, 0.0]]), torch.tensor([[0.0, 2.0]]))
        assert out.item() == pytest.approx(0.126928, abs=1e-6)

    def test_only_h_gets_gradient(self, batch):
        h, hg, _ = batch
        h, hg = h.clone().requires_grad_(True), hg.clone().requires_grad_(True)
        L.moon_loss(h, hg, -hg.detach()).backward()
        assert hg.grad is None and torch.isfinite(h.grad).all()


class TestRestricted:
    def test_direct(self, batch):
        z, _, y = batch
        present = [True, False, True, False, False]
        out = L.restricted_logits(z, torch.tensor(present), alpha=0.3)
        for i in range(len(z)):
            for c in range(C):
                assert out[i, c].item() == pytest.approx(float(z[i, c]) * (1.0 if present[c] else 0.3))
        # FedRS's loss is the cross-entropy of the restricted logits
        ce = np.mean([-math.log(np_softmax(rows(out[i]))[yi]) for i, yi in enumerate(y.tolist())])
        assert F.cross_entropy(out, y).item() == pytest.approx(ce, rel=1e-5)

    def test_hand_worked_and_dtype(self):
        out = L.restricted_logits(torch.tensor([[2.0, 4.0]], dtype=torch.bfloat16), torch.tensor([True, False]), 0.5)
        assert out.dtype == torch.bfloat16 and out.float().tolist() == [[2.0, 2.0]]


# --------------------------------------------------------------------------------------------------- mixed precision
def _losses(y):
    majority = torch.tensor(MAJORITIES[0])
    eye = torch.eye(C)
    return {
        "kd": lambda a, b: L.kd_loss(a, b, 2.0),
        "ntd": lambda a, b: L.ntd_loss(a, b, y, 2.0),
        "lmd": lambda a, b: L.lmd_loss(a, b, y, majority),
        "lmd_tf": lambda a, b: L.lmd_tf_loss(a, y, majority),
        "ssd": lambda a, b: L.ssd_loss(a, b, L.ssd_weights(b, y, eye, 0.5)),
        "cad": lambda a, b: L.cad_loss(a, b, y, L.cad_class_weights(b, y, C)),
        "ka": lambda a, b: L.ka_loss(a, b, majority),
        "moon": lambda a, b: L.moon_loss(a, b, -b),
    }


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(_losses(torch.zeros(1)).keys()))
def test_half_precision_inputs_give_float32(batch, dtype, name):
    z, zg, y = batch
    fn = _losses(y)[name]
    zh, zgh = z.to(dtype).requires_grad_(True), zg.to(dtype)
    half = fn(zh, zgh)
    assert half.dtype == torch.float32 and half.dim() == 0
    # exactly the float32 computation on the rounded inputs, and close to it on the original ones
    torch.testing.assert_close(half, fn(zh.detach().float(), zgh.float()))
    assert half.item() == pytest.approx(fn(z, zg).item(), rel=0.05, abs=1e-2)
    half.backward()
    assert zh.grad.dtype == dtype and torch.isfinite(zh.grad.float()).all()
