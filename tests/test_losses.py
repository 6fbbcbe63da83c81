"""Every loss against a direct, separately written computation, hand-worked numbers, and its defining properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_lightning import losses as L


def _softmax(v):
    e = np.exp(v - np.max(v))
    return e / e.sum()


def _kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True) if pi > 0)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(7, 5, generator=g) * 2
    zg = torch.randn(7, 5, generator=g) * 2
    y = torch.tensor([0, 1, 2, 3, 4, 0, 3])
    return z, zg, y


class TestKD:
    def test_matches_kl_div(self, batch):
        z, zg, _ = batch
        expected = F.kl_div(F.log_softmax(z / 3, 1), F.softmax(zg / 3, 1), reduction="batchmean") * 9
        torch.testing.assert_close(L.kd_loss(z, zg, tau=3.0), expected)

    def test_hand_worked(self):
        # p = softmax([0, ln 3]) = [1/4, 3/4], q = uniform [1/2, 1/2]: KL = 1/4 ln(1/2) + 3/4 ln(3/2)
        z, zg = torch.zeros(1, 2), torch.tensor([[0.0, math.log(3)]])
        assert L.kd_loss(z, zg).item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=1e-6)


class TestNTD:
    def test_direct(self, batch):
        z, zg, y = batch
        tau = 2.0
        total = 0.0
        for i in range(len(y)):
            others = [c for c in range(5) if c != int(y[i])]
            p = _softmax(zg[i, others].numpy() / tau)
            q = _softmax(z[i, others].numpy() / tau)
            total += _kl(p, q)
        assert L.ntd_loss(z, zg, y, tau).item() == pytest.approx(tau**2 * total / len(y), rel=1e-5)

    def test_hand_worked(self):
        # y = 0; not-true logits z = [0, 0] -> q = [1/2, 1/2]; z_g = [0, ln 3] -> p = [1/4, 3/4]
        z = torch.tensor([[9.0, 0.0, 0.0]])
        zg = torch.tensor([[-4.0, 0.0, math.log(3)]])
        expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
        assert L.ntd_loss(z, zg, torch.tensor([0])).item() == pytest.approx(expected, abs=1e-6)

    def test_true_class_gets_no_gradient(self, batch):
        z, zg, y = batch
        z = z.clone().requires_grad_(True)
        L.ntd_loss(z, zg, y, tau=3.0).backward()
        assert torch.all(z.grad[torch.arange(len(y)), y] == 0)
        assert z.grad.abs().sum() > 0

    def test_finite_with_huge_logits(self):
        z = torch.tensor([[1e4, -1e4, 0.0]], requires_grad=True)
        out = L.ntd_loss(z, torch.tensor([[-1e4, 1e4, 5.0]]), torch.tensor([0]))
        out.backward()
        assert torch.isfinite(out) and torch.isfinite(z.grad).all()


class TestLMD:
    def test_majority_rule(self):
        # n_k = 10, C = 4, mean 2.5: strictly more than the mean is majority
        assert L.majority_mask(torch.tensor([5, 2, 0, 3])).tolist() == [True, False, False, True]

    def test_direct(self, batch):
        z, zg, y = batch
        majority = torch.tensor([True, False, False, True, False])
        total = 0.0
        for i in range(len(y)):
            yi = int(y[i])
            teacher = [c for c in range(5) if c != yi and not majority[c]]
            student = [c for c in range(5) if c != yi]
            if not teacher:
                continue
            p = dict(zip(teacher, _softmax(zg[i, teacher].numpy()), strict=True))
            q = dict(zip(student, _softmax(z[i, student].numpy()), strict=True))
            total += sum(p[c] * math.log(p[c] / q[c]) for c in teacher)
        assert L.lmd_loss(z, zg, y, majority).item() == pytest.approx(total / len(y), rel=1e-5)

    def test_majority_masked_in_teacher(self, batch):
        z, zg, y = batch
        majority = torch.tensor([True, False, False, True, False])
        zg2 = zg.clone()
        zg2[:, majority] += 7.0
        torch.testing.assert_close(L.lmd_loss(z, zg, y, majority), L.lmd_loss(z, zg2, y, majority))

    def test_true_class_masked_in_student(self, batch):
        z, zg, y = batch
        z = z.clone().requires_grad_(True)
        L.lmd_loss(z, zg, y, torch.tensor([False, False, True, False, False])).backward()
        assert torch.all(z.grad[torch.arange(len(y)), y] == 0)

    def test_finite_when_y_is_minority(self):
        # y = 1 is a minority label (not in the majority set): the teacher must not put mass on it
        z = torch.tensor([[0.0, -50.0, 1.0, 2.0]])
        out = L.lmd_loss(
            z, torch.tensor([[0.0, 30.0, 1.0, 0.0]]), torch.tensor([1]), torch.tensor([True] + [False] * 3)
        )
        assert torch.isfinite(out)

    def test_zero_when_every_other_class_is_majority(self):
        majority = torch.tensor([True, True, False])
        out = L.lmd_loss(torch.randn(1, 3), torch.randn(1, 3), torch.tensor([2]), majority)
        assert out.item() == 0.0

    def test_tf_target_sums_to_one_over_unmasked(self, batch):
        _, _, y = batch
        majority = torch.tensor([False, True, False, False, True])
        target = L.lmd_tf_target(y, majority, 5)
        for i, yi in enumerate(y.tolist()):
            allowed = [c for c in range(5) if c != yi and not majority[c]]
            assert target[i, allowed].sum().item() == pytest.approx(1.0)
            assert torch.all(target[i, [c for c in range(5) if c not in allowed]] == 0)

    def test_tf_loss_direct(self, batch):
        z, _, y = batch
        majority = torch.tensor([False, True, False, False, False])
        total = 0.0
        for i in range(len(y)):
            yi = int(y[i])
            allowed = [c for c in range(5) if c != yi and not majority[c]]
            student = [c for c in range(5) if c != yi]
            q = dict(zip(student, _softmax(z[i, student].numpy()), strict=True))
            total += sum((1 / len(allowed)) * math.log((1 / len(allowed)) / q[c]) for c in allowed)
        assert L.lmd_tf_loss(z, y, majority).item() == pytest.approx(total / len(y), rel=1e-5)


class TestSSD:
    def test_credibility_rows(self):
        preds, targets = torch.tensor([0, 1, 1, 2, 2, 2]), torch.tensor([0, 0, 1, 1, 2, 2])
        a = L.credibility_matrix(preds, targets, 3)
        assert a.tolist() == [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]]
        torch.testing.assert_close(a.sum(1), torch.ones(3))

    def test_weights_direct_and_bounds(self, batch):
        _, zg, y = batch
        a = torch.tensor(
            [
                [0.9, 0.05, 0.05, 0, 0],
                [0.1, 0.8, 0.1, 0, 0],
                [0, 0, 1, 0, 0],
                [0, 0, 0, 0.95, 0.05],
                [0, 0, 0, 0.3, 0.7],
            ],
            dtype=torch.float32,
        )
        m = L.ssd_weights(zg, y, a, m_max=0.01)
        for i in range(len(y)):
            p = _softmax(zg[i].numpy())
            m_sample = 1 - (1 - p[int(y[i])]) ** 0.5
            for k in range(5):
                m_class = float(a[k, k]) * (1 - max(float(a[j, k]) for j in range(5) if j != k))
                assert m[i, k].item() == pytest.approx(0.01 * max(0.0, m_class * m_sample - 0.1), abs=1e-7)
        assert m.min() >= 0 and m.max() <= 0.01
        assert m.max() > 0

    def test_weights_carry_no_gradient(self, batch):
        _, zg, y = batch
        zg = zg.clone().requires_grad_(True)
        assert not L.ssd_weights(zg, y, torch.eye(5), 0.01).requires_grad

    def test_loss_direct_and_zero_at_teacher(self, batch):
        z, zg, y = batch
        m = L.ssd_weights(zg, y, torch.eye(5), 0.01)
        expected = ((m * zg - m * z) ** 2).sum(1).mean()
        torch.testing.assert_close(L.ssd_loss(z, zg, m), expected)
        assert L.ssd_loss(zg, zg, m).item() == 0.0


class TestCAD:
    def test_alpha_direct_and_bounds(self, batch):
        _, zg, y = batch
        alpha = L.cad_class_weights(zg, y, 5, beta=0.25, gamma=0.5)
        for c in range(5):
            rows = [i for i in range(len(y)) if int(y[i]) == c]
            phis = []
            for i in rows:
                p = _softmax(zg[i].numpy())
                phis.append(p[c] - sum(p[k] for k in range(5) if k != c))
            assert alpha[c].item() == pytest.approx(0.5 * 0.25 * np.mean(phis) + 0.5 * 0.75, abs=1e-6)
        assert alpha.min() >= 0.25 and alpha.max() <= 0.5

    def test_zero_alpha_is_fedavg(self, batch):
        z, zg, y = batch
        alpha = L.cad_class_weights(zg, y, 5, beta=0.0, gamma=0.0)
        assert torch.all(alpha == 0)
        torch.testing.assert_close(L.cad_loss(z, zg, y, alpha), F.cross_entropy(z, y))

    def test_constant_alpha_is_lsd(self, batch):
        z, zg, y = batch
        alpha = L.cad_class_weights(zg, y, 5, beta=0.3, gamma=0.3)
        soft = -(F.softmax(zg / 2, 1) * F.log_softmax(z / 2, 1)).sum(1).mean()
        torch.testing.assert_close(L.cad_loss(z, zg, y, alpha, tau=2.0), 0.7 * F.cross_entropy(z, y) + 0.3 * soft)


class TestKA:
    def test_groups(self):
        missing, non_dom, dom = L.ka_class_groups(torch.tensor([0, 1, 10, 40, 49]), gamma=0.05)
        assert missing.tolist() == [True, False, False, False, False]
        assert non_dom.tolist() == [False, True, False, False, False]
        assert dom.tolist() == [False, False, True, True, True]
        assert torch.all(missing.int() + non_dom.int() + dom.int() == 1)

    def test_loss_ignores_dominant_logits(self, batch):
        z, zg, _ = batch
        dominant = torch.tensor([False, True, True, False, False])
        z2 = z.clone()
        z2[:, dominant] += 100.0
        torch.testing.assert_close(L.ka_loss(z, zg, dominant), L.ka_loss(z2, zg, dominant))

    def test_hand_worked(self):
        z, zg = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
        # class 1 dominant: sample 1 -> (0)^2 + (3)^2 = 9, sample 2 -> 1 + 1 = 2; mean 5.5
        assert L.ka_loss(z, zg, torch.tensor([False, True, False])).item() == pytest.approx(5.5)

    def test_empty_anchor_set(self):
        assert L.ka_loss(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(3, dtype=torch.bool)).item() == 0.0


class TestBaselines:
    def test_prox(self):
        w = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
        wg = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
        assert L.prox_term(w, wg).item() == pytest.approx(1 + 4 + 4)

    def test_moon(self, batch):
        h, hg, _ = batch
        hp = -h
        pos = F.cosine_similarity(h, hg) / 0.5
        neg = F.cosine_similarity(h, hp) / 0.5
        expected = (-torch.log(torch.exp(pos) / (torch.exp(pos) + torch.exp(neg)))).mean()
        torch.testing.assert_close(L.moon_loss(h, hg, hp, 0.5), expected)

    def test_restricted(self):
        out = L.restricted_logits(torch.tensor([[2.0, 4.0]]), torch.tensor([True, False]), 0.5)
        assert out.tolist() == [[2.0, 2.0]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_give_float32(batch, dtype):
    z, zg, y = batch
    majority = torch.tensor([True, False, False, False, False])
    for fn in (
        lambda a, b: L.kd_loss(a, b, 2.0),
        lambda a, b: L.ntd_loss(a, b, y),
        lambda a, b: L.lmd_loss(a, b, y, majority),
        lambda a, b: L.cad_loss(a, b, y, torch.full((5,), 0.3)),
    ):
        half = fn(z.to(dtype), zg.to(dtype))
        assert half.dtype == torch.float32
        assert half.item() == pytest.approx(fn(z, zg).item(), rel=0.05, abs=1e-2)
