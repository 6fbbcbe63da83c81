"""Each method's client loss and client-start hook against its equation in docs/source/methods.md.

The tests call a method's hooks directly (hand-made contexts, a linear network) so that they check how each method wires
its loss to its data and hyper-parameters, without a federation; the losses' own edge cases are at the end.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.core import losses
from fl_lightning.core.context import ClientContext, ServerContext
from fl_lightning.methods import KD, FedCAD, FedKA, FedLMD, FedNTD, FedProx, FedRS, FedSSD

C = 4  # classes of the method tests
D = 3  # input features of their linear network


def _method(cls, seed=0, **kwargs):
    """A method on a D -> C linear network whose teacher (the "global" copy) differs from the student."""
    module = cls(
        net="lenet", num_classes=C, in_channels=1, image_size=8, lr=0.1, momentum=0.0, weight_decay=0.0, **kwargs
    )
    gen = torch.Generator().manual_seed(seed)
    module.net = nn.Linear(D, C)
    with torch.no_grad():
        for p in module.net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    if module.uses_teacher or cls is FedLMD:
        module.refresh_teacher()
        with torch.no_grad():
            for p in module.net.parameters():
                p.add_(torch.randn(p.shape, generator=gen))
    return module


def _client(x, y, class_counts=None, server=None, round=0, seed=0):
    counts = torch.bincount(y, minlength=C) if class_counts is None else class_counts
    return ClientContext(
        round=round,
        client=0,
        num_samples=len(y),
        class_counts=counts,
        steps=1,
        lr=0.1,
        weight=1.0,
        server=server or {},
        state={},
        global_weights={},
        read_data=lambda: (x, y),
        transform=lambda t, train: t.float(),
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(seed),
    )


def _batch(n=6, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=gen) * 2, torch.randint(C, (n,), generator=gen)


def _kl(p, q):
    """Σ p log(p/q) per row, 0·log 0 = 0."""
    return torch.where(p > 0, p * (p.clamp_min(1e-38).log() - q.clamp_min(1e-38).log()), torch.zeros_like(p)).sum(1)


# ---- the methods' client losses: each against its equation ---------------------------------------------------------


def test_kd_client_loss_is_one_minus_beta_ce_plus_beta_tau2_kl():
    module = _method(KD, beta=0.4, tau=2.0)
    x, y = _batch()
    z, zg = module(x), module.teacher_logits(x)
    kl = _kl(F.softmax(zg / 2.0, 1), F.softmax(z / 2.0, 1)).mean()
    expected = 0.6 * F.cross_entropy(z, y) + 0.4 * 4.0 * kl
    torch.testing.assert_close(module.client_loss(x, y), expected)


def test_fedntd_client_loss_uses_beta_and_tau():
    module = _method(FedNTD, beta=0.3, tau=3.0)
    x, y = _batch()
    z, zg = module(x), module.teacher_logits(x)
    keep = torch.arange(C)[None, :] != y[:, None]
    zt, zgt = z[keep].view(len(y), C - 1), zg[keep].view(len(y), C - 1)
    ntd = _kl(F.softmax(zgt / 3.0, 1), F.softmax(zt / 3.0, 1)).mean()
    torch.testing.assert_close(module.client_loss(x, y), F.cross_entropy(z, y) + 0.3 * 9.0 * ntd)


def _lmd_direct(z, zg, y, majority, tau):
    """methods.md's FedLMD: teacher over i ∉ Y_k ∪ {y}, student over i ≠ y, 0 for a sample with no teacher class."""
    out = []
    for i in range(len(y)):
        keep_t = ~majority.clone()
        keep_t[y[i]] = False
        keep_s = torch.ones(C, dtype=torch.bool)
        keep_s[y[i]] = False
        if not keep_t.any():
            out.append(torch.tensor(0.0))
            continue
        p = torch.zeros(C)
        p[keep_t] = F.softmax(zg[i, keep_t] / tau, 0)
        q = torch.zeros(C)
        q[keep_s] = F.softmax(z[i, keep_s] / tau, 0)
        out.append(_kl(p[None], q[None])[0])
    return tau**2 * torch.stack(out).mean()


def test_fedlmd_majority_labels_and_client_loss():
    module = _method(FedLMD, beta=0.7, tau=2.0)
    x, y = _batch(8)
    counts = torch.tensor([9, 3, 0, 4])  # mean 4: only class 0 is a majority label (4 is not > 4)
    module.on_client_start(_client(x, y, class_counts=counts))
    assert module.majority.tolist() == [True, False, False, False]
    z, zg = module(x), module.teacher_logits(x)
    expected = F.cross_entropy(z, y) + 0.7 * _lmd_direct(z.detach(), zg, y, module.majority, 2.0)
    torch.testing.assert_close(module.client_loss(x, y), expected)


def test_fedlmd_tf_switches_to_the_teacher_at_the_switch_round():
    module = _method(FedLMD, teacher_free=True, switch_round=2)
    x, y = _batch()
    assert [module.teacher_needed(_client(x, y, round=r)) for r in (0, 1, 2, 3)] == [False, False, True, True]


def test_fedssd_credibility_uses_aux_per_class_samples_and_the_loss_uses_its_columns():
    module = _method(FedSSD, m_max=0.5, aux_per_class=2)
    with torch.no_grad():  # the global model predicts argmax of the first C−1 features, class 3 never
        module.net.weight.copy_(torch.cat([torch.eye(D), torch.full((1, D), -5.0)]))
        module.net.bias.zero_()
    # per class three aux samples; the second of class 0 and the third of class 1 are predicted as class 2
    e = torch.eye(D)
    aux_x = torch.stack([e[0], e[2], e[0], e[1], e[1], e[2], e[2], e[2], e[2], e[0], e[0], e[0]])
    aux_y = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    server = ServerContext(
        round=0,
        clients=(0,),
        weights=(1.0,),
        num_clients=1,
        global_weights={},
        param_keys=frozenset(),
        state={},
        aux_x=aux_x,
        aux_y=aux_y,
        num_classes=C,
        client_class_counts=torch.zeros(1, C, dtype=torch.long),
        transform=lambda t, train: t.float(),
        device=torch.device("cpu"),
    )
    credibility = module.on_round_start(server)["credibility"]
    # the first two of each class: class 0 -> (0, 2), class 1 -> (1, 1), class 2 -> (2, 2), class 3 -> (0, 0)
    expected = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(credibility, expected)
    # the client loss with an asymmetric credibility matrix: M_class[k] = A[k,k]·(1 − max_{k'≠k} A[k',k])
    module = _method(FedSSD, m_max=0.5)
    a = torch.tensor([[0.9, 0.1, 0.0, 0.0], [0.6, 0.4, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.2, 0.0, 0.0, 0.8]])
    module.on_client_start(_client(*_batch(), server={"credibility": a}))
    m_class = torch.tensor([0.9 * (1 - 0.6), 0.4 * (1 - 0.1), 1.0, 0.8])
    x, y = _batch()
    z, zg = module(x), module.teacher_logits(x)
    m_sample = 1 - (1 - F.softmax(zg, 1)[torch.arange(len(y)), y]) ** 0.5
    weights = 0.5 * (m_class[None, :] * m_sample[:, None] - 0.1).clamp_min(0.0)
    expected = F.cross_entropy(z, y) + ((weights * zg - weights * z) ** 2).sum(1).mean()
    torch.testing.assert_close(module.client_loss(x, y), expected)


def test_fedcad_alpha_from_the_global_model_on_the_clients_data_and_its_loss():
    beta, gamma, tau = 0.1, 0.7, 2.0
    module = _method(FedCAD, beta=beta, gamma=gamma, tau=tau)
    x, y = _batch(12)
    module.on_client_start(_client(x, y))
    p_g = F.softmax(module.teacher_logits(x), 1)
    phi = p_g[torch.arange(len(y)), y] - (p_g.sum(1) - p_g[torch.arange(len(y)), y])
    alpha = torch.full((C,), beta)
    for c in y.unique():
        alpha[c] = 0.5 * (gamma - beta) * phi[y == c].mean() + 0.5 * (gamma + beta)
    torch.testing.assert_close(module.alpha, alpha)
    z, zg = module(x), module.teacher_logits(x)
    a = alpha[y]
    soft = -(F.softmax(zg / tau, 1) * F.log_softmax(z / tau, 1)).sum(1)
    expected = ((1 - a) * F.cross_entropy(z, y, reduction="none") + a * soft).mean()
    torch.testing.assert_close(module.client_loss(x, y), expected)


def _ka_client(counts, seed=0, per_class_offset=10.0):
    """A client whose sample j of class c has features (c·offset + j, ·, ·); shared samples are −(c + 1)."""
    xs, ys = [], []
    for c, n in enumerate(counts):
        for j in range(n):
            xs.append(torch.tensor([c * per_class_offset + j, 0.0, 1.0]))
            ys.append(c)
    x, y = torch.stack(xs), torch.tensor(ys)
    shared_x = torch.stack([torch.tensor([-(c + 1.0), 0.0, 0.0]) for c in range(C)])
    server = {"shared_x": shared_x, "shared_y": torch.arange(C)}
    return _client(x, y, server=server, seed=seed)


def test_fedka_default_gamma_is_half_the_uniform_share():
    assert _method(FedKA).gamma == pytest.approx(1 / (2 * C))


def test_fedka_anchor_set_shared_samples_of_missing_and_local_samples_of_non_dominant_classes():
    # class 0: 40 samples (dominant), class 1: 2 (fraction 0.048 < 1/8: non-dominant), classes 2 and 3 missing
    module = _method(FedKA, beta=0.3)
    client = _ka_client([40, 2, 0, 0])
    module.on_client_start(client)
    assert module.dominant.tolist() == [True, False, False, False]
    first = sorted(module.anchor_x[:, 0].tolist())
    assert first[:2] == [-4.0, -3.0]  # the shared samples of the missing classes 3 and 2
    assert first[2] in (10.0, 11.0) and len(first) == 3  # one local sample of class 1
    torch.testing.assert_close(module.anchor_zg, module.teacher_logits(module.anchor_x))
    x, y = client.x[:5].float(), client.y[:5]
    z_a, zg_a = module(module.anchor_x), module.anchor_zg
    keep = torch.tensor([False, True, True, True])
    ka = ((zg_a - z_a)[:, keep] ** 2).sum(1).mean()
    torch.testing.assert_close(module.client_loss(x, y), F.cross_entropy(module(x), y) + 0.3 * ka)


def test_fedka_keeps_mu_anchors_and_draws_the_local_sample_at_random():
    module = _method(FedKA, mu=2)
    module.on_client_start(_ka_client([40, 2, 0, 0]))
    assert len(module.anchor_x) == 2
    picks = set()
    for seed in range(12):
        module = _method(FedKA)
        module.on_client_start(_ka_client([60, 5, 0, 0], seed=seed))
        local = [v for v in module.anchor_x[:, 0].tolist() if v >= 0]
        assert len(local) == 1 and 10.0 <= local[0] < 15.0
        picks.add(local[0])
    assert len(picks) > 1  # "one random local sample of c"


def test_fedprox_gradient_of_the_penalty_is_mu_times_the_distance():
    module = _method(FedProx, mu=0.3)
    x, y = _batch()
    module.on_client_start(_client(x, y))
    w_g = [p.detach().clone() for p in module.parameters()]
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.5)
    module.zero_grad()
    (module.client_loss(x, y) - F.cross_entropy(module(x), y)).backward()
    for p, g in zip(module.parameters(), w_g, strict=True):
        torch.testing.assert_close(p.grad, 0.3 * (p.detach() - g))


def test_fedrs_scales_only_the_absent_classes():
    module = _method(FedRS, alpha=0.25)
    x, y = _batch()
    module.on_client_start(_client(x, y, class_counts=torch.tensor([3, 0, 5, 0])))
    assert module.present.tolist() == [True, False, True, False]
    z = module(x)
    expected = F.cross_entropy(z * torch.tensor([1.0, 0.25, 1.0, 0.25]), y)
    torch.testing.assert_close(module.client_loss(x, y), expected)


# ---- losses: edge cases ---------------------------------------------------------------------------------------------


def test_kl_losses_stay_finite_when_a_teacher_probability_underflows_with_log_p_infinite():
    """0·log 0 = 0 explicitly: a teacher log-probability of −inf (logits 6e38 apart) must not give NaN."""
    z = torch.zeros(1, 3, requires_grad=True)
    zg = torch.tensor([[-3e38, 3e38, 0.0]])
    for value in (losses.kd_loss(z, zg), losses.ntd_loss(z, zg, torch.tensor([2]))):
        assert torch.isfinite(value)
        (grad,) = torch.autograd.grad(value, z)
        assert torch.isfinite(grad).all()


def test_ka_loss_with_padding_rows_is_the_loss_of_the_anchors_alone():
    gen = torch.Generator().manual_seed(0)
    z, zg = torch.randn(3, C, generator=gen), torch.randn(3, C, generator=gen)
    dominant = torch.tensor([True, False, False, False])
    rows = torch.tensor([0, 1, 2, 0, 1])  # five rows, the last two repeat anchors 0 and 1 and weigh 0
    weight = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
    direct = ((zg - z)[:, 1:] ** 2).sum(1).mean()
    torch.testing.assert_close(losses.ka_loss(z[rows], zg[rows], dominant, weight), direct)
