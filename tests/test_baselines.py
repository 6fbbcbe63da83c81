"""SCAFFOLD, FedDyn, MOON, FedNova and FedCurv: each rule against a hand computation on tiny tensors, through the pure
functions and through the method's hooks called directly (hand-made contexts, no Federation), then end to end."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_run
from torch import nn

from fl_lightning.core import losses
from fl_lightning.core.server_optim import ServerSGD
from fl_lightning.methods import METHODS, MOON, SCAFFOLD, FedAvg, FedCurv, FedDyn, FedNova

BASELINES = {"scaffold": SCAFFOLD, "feddyn": FedDyn, "moon": MOON, "fednova": FedNova, "fedcurv": FedCurv}


def tiny_module(cls, momentum=0.0, lr=0.1, **kwargs):
    """A method whose network is a 2x2 linear layer: its parameter vector is (W00, W01, W10, W11, b0, b1)."""
    module = cls(net="lenet", num_classes=2, in_channels=1, image_size=8, lr=lr, momentum=momentum, weight_decay=0.0)
    for key, value in kwargs.items():
        setattr(module, key, value)
    module.net = nn.Linear(2, 2)
    return module


def set_params(module, vector):
    with torch.no_grad():
        for p, v in zip(
            module.parameters(), torch.as_tensor(vector).split([p.numel() for p in module.parameters()]), strict=True
        ):
            p.copy_(v.view_as(p))


def state_of(module, vector):
    set_params(module, vector)
    return {k: v.clone() for k, v in module.state_dict().items()}


def client_ctx(global_weights, round=0, client=0, steps=1, lr=0.1, server=None, state=None, x=None, y=None):
    return SimpleNamespace(
        round=round,
        client=client,
        steps=steps,
        lr=lr,
        weight=1.0,
        server=server or {},
        state={} if state is None else state,
        global_weights=global_weights,
        x=x,
        y=y,
        transform=lambda t, train: t.float(),
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
    )


def server_ctx(global_weights, param_keys, num_clients, clients=(0,), weights=(1.0,), state=None):
    return SimpleNamespace(
        round=0,
        clients=clients,
        weights=weights,
        num_clients=num_clients,
        global_weights=global_weights,
        param_keys=frozenset(param_keys),
        state={} if state is None else state,
        device=torch.device("cpu"),
    )


def flat(state, module):
    return torch.cat([state[name].reshape(-1) for name, _ in module.named_parameters()])


# ---- FedNova's a_k ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("steps", "rho", "expected"), [(4, 0.0, 4.0), (3, 0.5, 4.25), (1, 0.9, 1.0), (2, 0.9, 2.9)])
def test_fednova_a_hand_values(steps, rho, expected):
    # K=3, ρ=½: (3 − ½·(1 − ⅛)/½)/½ = (3 − 0.875)·2 = 4.25; K=2, ρ=0.9: steps of g and 1.9·g
    assert losses.fednova_a(steps, rho) == pytest.approx(expected)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_fednova_a_is_the_displacement_of_momentum_sgd(rho):
    w = torch.zeros(3, requires_grad=True)
    g = torch.tensor([1.0, -2.0, 0.5])
    opt = torch.optim.SGD([w], lr=0.1, momentum=rho)
    for _ in range(7):
        opt.zero_grad()
        (w * g).sum().backward()
        opt.step()
    torch.testing.assert_close(-w.detach(), 0.1 * losses.fednova_a(7, rho) * g)


def test_fednova_a_rejects_bad_input():
    with pytest.raises(ValueError, match="momentum"):
        losses.fednova_a(3, 1.0)


# ---- SCAFFOLD -------------------------------------------------------------------------------------------------------


def test_scaffold_control_update_by_hand():
    c_k, c = torch.tensor([1.0, 0.0]), torch.tensor([0.5, -1.0])
    w_g, w_k = torch.tensor([2.0, 2.0]), torch.tensor([1.0, 3.0])
    # c_k − c + (w_g − w_k)/(K·lr) with K·lr = 0.5: [1 − 0.5 + 2, 0 + 1 − 2]
    expected = torch.tensor([2.5, -1.0])
    torch.testing.assert_close(losses.scaffold_control_update(c_k, c, w_g, w_k, 0.5), expected)


def _scaffold_client(module, w_g_vec, c, c_k, grad, steps, lr):
    """Run ``steps`` local steps of the linear loss <grad, w> through the module's hooks; return (ctx, upload)."""
    global_weights = state_of(module, w_g_vec)
    ctx = client_ctx(global_weights, steps=steps, lr=lr, server={"c": c}, state={} if c_k is None else {"c": c_k})
    module.on_client_start(ctx)
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=module.hparams.momentum)
    for _ in range(steps):
        opt.zero_grad()
        (torch.cat([p.reshape(-1) for p in module.parameters()]) * grad).sum().backward()
        params = list(module.parameters())
        for p, g in zip(params, module.local_gradient([p.grad for p in params]), strict=True):
            p.grad = g
        opt.step()
    return ctx, module.on_client_end(ctx)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_scaffold_client_round_by_hand(momentum):
    """With a constant gradient g, every step descends g + c − c_k, and option II recovers c_k⁺ = g exactly."""
    module = tiny_module(SCAFFOLD, momentum=momentum)
    g = torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0, -0.5])
    c, c_k = torch.full((6,), 0.25), torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    w_g = torch.arange(6.0)
    ctx, upload = _scaffold_client(module, w_g, c, c_k, g, steps=5, lr=0.1)
    a = losses.fednova_a(5, momentum)
    torch.testing.assert_close(flat(module.state_dict(), module), w_g - 0.1 * a * (g + c - c_k))
    torch.testing.assert_close(ctx.state["c"], g)
    torch.testing.assert_close(upload["delta_c"], g - c_k)


def test_scaffold_first_round_controls_are_zero_and_leave_gradients_alone():
    module = tiny_module(SCAFFOLD)
    server = server_ctx({}, [], num_clients=3)
    payload = module.on_round_start(server)
    torch.testing.assert_close(payload["c"], torch.zeros(6))
    g = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    ctx, _ = _scaffold_client(module, torch.zeros(6), payload["c"], None, g, steps=1, lr=0.1)
    torch.testing.assert_close(flat(module.state_dict(), module), -0.1 * g)  # a plain SGD step


def test_scaffold_server_update_by_hand():
    module = tiny_module(SCAFFOLD)
    w_g, avg = state_of(module, torch.zeros(6)), state_of(module, torch.full((6,), 2.0))
    server = server_ctx(w_g, w_g, num_clients=4, clients=(0, 2), weights=(0.5, 0.5), state={"c": torch.ones(6)})
    # uploads of "delta_c" are summed over the round's clients: Δc_0 + Δc_2
    new = module.server_update(server, avg, {"delta_c": torch.full((6,), 2.0)})
    torch.testing.assert_close(flat(new, module), torch.full((6,), 2.0))  # the weights: the average
    # η_g is the federation's one server learning rate, applied after the method's server step
    new = ServerSGD(lr=0.5).step(w_g, new, keys=[k for k, _ in module.named_parameters()])
    torch.testing.assert_close(flat(new, module), torch.full((6,), 1.0))  # w_g + ½·(2 − 0)
    torch.testing.assert_close(server.state["c"], torch.full((6,), 1.5))  # c + (1/N)·Σ Δc = 1 + 2/4


def test_scaffold_server_control_stays_the_mean_of_client_controls():
    module = tiny_module(SCAFFOLD)
    n_clients = 3
    states = {k: {} for k in range(n_clients)}
    server = server_ctx(state_of(module, torch.zeros(6)), [], num_clients=n_clients)
    gen = torch.Generator().manual_seed(0)
    for clients in ((0, 1), (1, 2), (0,)):
        payload = module.on_round_start(server)
        total = torch.zeros(6)
        for k in clients:
            g = torch.randn(6, generator=gen)
            c_k = states[k].get("c")
            ctx, upload = _scaffold_client(module, torch.zeros(6), payload["c"], c_k, g, steps=2, lr=0.1)
            states[k] = ctx.state
            total += upload["delta_c"]
        module.server_update(server, state_of(module, torch.zeros(6)), {"delta_c": total})
    mean_c = sum(s.get("c", torch.zeros(6)) for s in states.values()) / n_clients
    torch.testing.assert_close(server.state["c"], mean_c)


# ---- FedNova --------------------------------------------------------------------------------------------------------


def test_fednova_client_upload_and_server_step_by_hand():
    module = tiny_module(FedNova, momentum=0.5)
    w_g = state_of(module, torch.full((6,), 1.0))
    set_params(module, torch.full((6,), -1.5))
    upload = module.on_client_end(client_ctx(w_g, steps=3))
    assert float(upload["a"]) == pytest.approx(4.25)
    torch.testing.assert_close(upload["d"], torch.full((6,), 2.5 / 4.25))
    # two clients, p = (¼, ¾), a = (2, 4), d = (1, −1): τ_eff = 3.5, Σ p d = −½, w_g ← 1 − 3.5·(−½) = 2.75
    uploads = {"a": torch.tensor(0.25 * 2 + 0.75 * 4), "d": torch.full((6,), 0.25 * 1 - 0.75 * 1)}
    new = module.server_update(server_ctx(w_g, w_g, 4), state_of(module, torch.zeros(6)), uploads)
    torch.testing.assert_close(flat(new, module), torch.full((6,), 2.75))


def test_fednova_equal_steps_no_momentum_is_the_average():
    module = tiny_module(FedNova)
    w_g = state_of(module, torch.arange(6.0))
    locals_ = [torch.randn(6, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    p = (0.2, 0.3, 0.5)
    sums = {"a": torch.tensor(0.0), "d": torch.zeros(6)}
    for w_k, p_k in zip(locals_, p, strict=True):
        set_params(module, w_k)
        upload = module.on_client_end(client_ctx(w_g, steps=4))
        for key in sums:
            sums[key] = sums[key] + p_k * upload[key]
    average = state_of(module, sum(p_k * w_k for w_k, p_k in zip(locals_, p, strict=True)))
    new = module.server_update(server_ctx(w_g, w_g, 3), average, sums)
    torch.testing.assert_close(flat(new, module), flat(average, module))


# ---- FedDyn --------------------------------------------------------------------------------------------------------


def test_feddyn_linear_term_by_hand():
    assert float(losses.feddyn_linear_term([torch.tensor([2.0, 1.0])], [torch.tensor([0.5, -3.0])])) == -(1.0 - 3.0)


def _feddyn_client(module, w_g_state, w_k_vec, state, round=0):
    ctx = client_ctx(w_g_state, round=round, state=state)
    module.on_client_start(ctx)
    set_params(module, w_k_vec)
    return ctx, module.on_client_end(ctx)


def test_feddyn_h_over_two_rounds_by_hand():
    alpha, n_clients = 0.5, 4
    module = tiny_module(FedDyn, alpha=alpha)
    states = {0: {}, 1: {}}
    server = server_ctx(None, [], num_clients=n_clients)
    # round 1: w_g = 0, clients 0 and 1 end at 1 and 3 (every entry), p = (½, ½)
    w_g = state_of(module, torch.zeros(6))
    server.global_weights = w_g
    _, up0 = _feddyn_client(module, w_g, torch.full((6,), 1.0), states[0])
    _, up1 = _feddyn_client(module, w_g, torch.full((6,), 3.0), states[1])
    torch.testing.assert_close(states[0]["h"], torch.full((6,), -0.5))  # h_0 = −α·(1 − 0)
    torch.testing.assert_close(states[1]["h"], torch.full((6,), -1.5))
    new = module.server_update(
        server, state_of(module, torch.full((6,), 2.0)), {"delta_h": up0["delta_h"] + up1["delta_h"]}
    )
    # h = 0 − α·(1/4)·(1 + 3) = −0.5; w_g = 2 − (−0.5)/0.5 = 3
    torch.testing.assert_close(server.state["h"], torch.full((6,), -0.5))
    torch.testing.assert_close(flat(new, module), torch.full((6,), 3.0))
    # round 2: w_g = 3, client 0 alone ends at 2
    w_g = state_of(module, torch.full((6,), 3.0))
    server.global_weights = w_g
    _, up0 = _feddyn_client(module, w_g, torch.full((6,), 2.0), states[0], round=1)
    torch.testing.assert_close(states[0]["h"], torch.full((6,), 0.0))  # −0.5 − 0.5·(2 − 3)
    new = module.server_update(server, state_of(module, torch.full((6,), 2.0)), {"delta_h": up0["delta_h"]})
    # h = −0.5 − 0.5·(1/4)·(2 − 3) = −0.375; w_g = 2 + 0.375/0.5 = 2.75
    torch.testing.assert_close(server.state["h"], torch.full((6,), -0.375))
    torch.testing.assert_close(flat(new, module), torch.full((6,), 2.75))


def test_feddyn_client_loss_gradient_by_hand():
    alpha = 0.2
    module = tiny_module(FedDyn, alpha=alpha)
    w_g = state_of(module, torch.zeros(6))
    h_k = torch.tensor([1.0, -1.0, 0.0, 2.0, 0.5, 0.0])
    module.on_client_start(client_ctx(w_g, state={"h": h_k}))
    w = torch.tensor([0.5, 0.5, -1.0, 0.0, 1.0, 2.0])
    set_params(module, w)
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([1])
    module.zero_grad()
    (module.client_loss(x, y) - F.cross_entropy(module(x), y)).backward()
    grad = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
    torch.testing.assert_close(grad, -h_k + alpha * (w - 0.0))  # ∇(−⟨h_k, w⟩ + (α/2)‖w − w_g‖²)


def test_feddyn_alpha_to_zero_client_is_fedavg_but_server_is_not():
    alpha = 1e-9
    module = tiny_module(FedDyn, alpha=alpha)
    w_g = state_of(module, torch.full((6,), 1.0))
    module.on_client_start(client_ctx(w_g, state={"h": torch.full((6,), -alpha * 3.0)}))
    set_params(module, torch.full((6,), 4.0))
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    assert module.client_loss(x, y).item() == pytest.approx(F.cross_entropy(module(x), y).item(), abs=1e-6)
    # first round, 4 clients of which 2 sampled, ending at 3 and 5 (Σ(w_k − w_g) = 6): h/α = −6/4, independent of α
    server = server_ctx(w_g, w_g, num_clients=4)
    new = module.server_update(
        server, state_of(module, torch.full((6,), 4.0)), {"delta_h": torch.full((6,), -alpha * 6)}
    )
    torch.testing.assert_close(flat(new, module), torch.full((6,), 4.0 + 6 / 4))


# ---- MOON ----------------------------------------------------------------------------------------------------------


def test_moon_loss_by_hand():
    h = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    h_g = torch.tensor([[2.0, 0.0], [1.0, 0.0]])
    h_p = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    tau = 0.5
    # sample 1: sim(h, h_g) = 1, sim(h, h_p) = 0; sample 2: sim = 1/√2 and 1
    s1 = -torch.log(torch.exp(torch.tensor(2.0)) / (torch.exp(torch.tensor(2.0)) + 1))
    pos = torch.tensor(2**-0.5 / tau)
    s2 = -torch.log(torch.exp(pos) / (torch.exp(pos) + torch.exp(torch.tensor(2.0))))
    assert float(losses.moon_loss(h, h_g, h_p, tau)) == pytest.approx(float((s1 + s2) / 2), rel=1e-6)


def _moon():
    torch.manual_seed(0)
    return MOON(net="lenet", num_classes=10, in_channels=1, image_size=8, proj_dim=16)


def test_moon_head_is_part_of_the_model_and_previous_model_is_client_state():
    module = _moon()
    assert any(k.startswith("head.") for k in module.state_dict())
    assert module.head[-1].out_features == 16
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    w_g = {k: v.clone() for k, v in module.state_dict().items()}
    state = {}
    ctx = client_ctx(w_g, state=state)
    module.on_client_start(ctx)
    # the first time, the previous model is the global one: h = h_g = h_prev, ℓ_con = log 2
    moon = module.client_loss(x, y) - F.cross_entropy(module(x), y)
    assert moon.item() == pytest.approx(float(torch.log(torch.tensor(2.0))), rel=1e-5)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert module.on_client_end(ctx) is None
    assert set(state["prev"]) == set(module.state_dict())
    for k, v in module.state_dict().items():
        torch.testing.assert_close(state["prev"][k], v)
    # next round: the frozen previous model is the saved local one, the frozen global one the new global weights
    module.load_state_dict(w_g)
    module.on_client_start(client_ctx(w_g, round=1, state=state))
    with torch.no_grad():
        h_prev = torch.func.functional_call(module._frozen[1], module._prev_weights, x)
        module.load_state_dict(state["prev"])
        expected_prev = module.project(x)
        module.load_state_dict(w_g)
        h = module.project(x)
        h_g = module._frozen[0](x)
    torch.testing.assert_close(h_prev, expected_prev)
    torch.testing.assert_close(h_g, h)
    expected = F.cross_entropy(module(x), y) + losses.moon_loss(h, h_g, h_prev, 0.5)
    torch.testing.assert_close(module.client_loss(x, y), expected)


def test_moon_frozen_models_are_not_trained_or_saved():
    module = _moon()
    module.on_client_start(client_ctx({k: v.clone() for k, v in module.state_dict().items()}))
    assert len(list(module.parameters())) == len(list(module.net.parameters())) + 4
    assert all(not p.requires_grad for frozen in module._frozen for p in frozen.parameters())


def test_moon_needs_features():
    from fl_lightning.methods import MOON

    with pytest.raises(TypeError, match="MOON needs .*features"):
        MOON(net=nn.Linear(2, 2))


# ---- FedCurv -------------------------------------------------------------------------------------------------------


def test_fedcurv_penalty_from_sums_is_the_sum_over_clients():
    gen = torch.Generator().manual_seed(0)
    w = [torch.randn(3, 2, generator=gen), torch.randn(4, generator=gen)]
    clients = [
        (
            [torch.rand(3, 2, generator=gen), torch.rand(4, generator=gen)],
            [torch.randn(3, 2, generator=gen), torch.randn(4, generator=gen)],
        )
        for _ in range(3)
    ]
    direct = sum(((f * (wi - wj) ** 2).sum() for fs, ws in clients for f, wi, wj in zip(fs, w, ws, strict=True)))
    sums = [[sum(fs[i] for fs, _ in clients) for i in range(2)]]
    sums.append([sum(fs[i] * ws[i] for fs, ws in clients) for i in range(2)])
    sums.append([sum(fs[i] * ws[i] ** 2 for fs, ws in clients) for i in range(2)])
    assert float(losses.fedcurv_penalty(w, *sums)) == pytest.approx(float(direct), rel=1e-5)


def test_diagonal_fisher_is_the_mean_squared_per_sample_gradient():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3))
    net(torch.randn(8, 3))  # move BatchNorm's running statistics away from their initial values
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    fisher = losses.diagonal_fisher(net, x, y, batch_size=2)
    assert net.training  # restored
    net.eval()
    expected = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    for i in range(5):
        net.zero_grad()
        F.cross_entropy(net(x[i : i + 1]), y[i : i + 1]).backward()
        for n, p in net.named_parameters():
            expected[n] += p.grad**2 / 5
    for n in expected:
        torch.testing.assert_close(fisher[n], expected[n])


def test_fedcurv_client_uploads_and_excludes_its_own_contribution():
    module = tiny_module(FedCurv, lam=0.1, fisher_samples=3)
    w_g = state_of(module, torch.zeros(6))
    x, y = torch.randn(5, 2, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 1, 0, 1])
    set_params(module, torch.arange(6.0) / 10)
    state = {}
    ctx = client_ctx(w_g, round=2, x=x, y=y, state=state)
    upload = module.on_client_end(ctx)
    f_k, w_k = state["fisher"], state["weights"]
    assert state["round"] == 2
    torch.testing.assert_close(w_k, torch.arange(6.0) / 10)
    torch.testing.assert_close(upload["fisher_w"], f_k * w_k)
    torch.testing.assert_close(upload["fisher_w2"], f_k * w_k**2)
    assert bool((f_k > 0).any())
    # the server keeps the round's sums (this client and another one) and sends them down next round
    other_f, other_w = torch.rand(6), torch.randn(6)
    sums = {
        "fisher": f_k + other_f,
        "fisher_w": f_k * w_k + other_f * other_w,
        "fisher_w2": f_k * w_k**2 + other_f * other_w**2,
    }
    server = server_ctx(w_g, w_g, num_clients=5)
    assert module.on_round_start(server) == {"sums": None}
    assert module.server_update(server, w_g, sums) is w_g
    payload = module.on_round_start(server)
    module.on_client_start(client_ctx(w_g, round=3, server=payload, state=state))
    w = torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0, 1.0])
    set_params(module, w)
    xb, yb = torch.randn(2, 2), torch.tensor([0, 1])
    penalty = module.client_loss(xb, yb) - F.cross_entropy(module(xb), yb)
    assert penalty.item() == pytest.approx(0.1 * float((other_f * (w - other_w) ** 2).sum()), rel=1e-4)
    # a client that was not in the previous round sees every contribution
    module.on_client_start(client_ctx(w_g, round=3, server=payload, state={}))
    penalty = module.client_loss(xb, yb) - F.cross_entropy(module(xb), yb)
    full = (other_f * (w - other_w) ** 2).sum() + (f_k * (w - w_k) ** 2).sum()
    assert penalty.item() == pytest.approx(0.1 * float(full), rel=1e-4)


def test_fedcurv_first_round_is_fedavg():
    module = tiny_module(FedCurv)
    module.on_client_start(client_ctx(state_of(module, torch.zeros(6)), server={"sums": None}))
    x, y = torch.randn(2, 2), torch.tensor([0, 1])
    torch.testing.assert_close(module.client_loss(x, y), F.cross_entropy(module(x), y))


# ---- registry, options, precision --------------------------------------------------------------------------------


def test_registry_short_names_and_exact_steps():
    for name, cls in BASELINES.items():
        assert METHODS[name] is cls
    assert {n for n, c in BASELINES.items() if c.needs_exact_steps} == {"scaffold", "fednova", "feddyn", "fedcurv"}


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (FedDyn, {"alpha": 0.0}, "alpha"),
        (MOON, {"tau": 0.0}, "tau"),
        (FedCurv, {"fisher_samples": 0}, "fisher_samples"),
    ],
)
def test_bad_hyperparameters(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_select_by_class_name_on_the_command_line():
    from fl_lightning.cli import cli_main

    root = Path(__file__).resolve().parent.parent
    for name, cls in BASELINES.items():
        cli = cli_main(["--config", str(root / "configs/quickstart.yaml"), "--model", cls.__name__], run=False)
        assert type(cli.model) is cls and cli.model.method_name == name


# ---- end to end (the Federation callback's hook plumbing) ----------------------------------------------------------


def _global_after_one_round(tmp_path, method, model_kwargs=None):
    _, _, model = tiny_run(
        tmp_path,
        method=method,
        rounds=1,
        data_kwargs={"partition": "iid"},
        model_kwargs={"momentum": 0.0, **(model_kwargs or {})},
    )
    return {k: v.clone() for k, v in model.net.state_dict().items()}


@pytest.mark.parametrize("method", [SCAFFOLD, FedNova])
def test_zero_controls_and_equal_steps_reproduce_fedavg(tmp_path, method):
    """SCAFFOLD's first round (zero controls) and FedNova with equal steps and no momentum are FedAvg's round."""
    fedavg = _global_after_one_round(tmp_path / "fedavg", FedAvg)
    other = _global_after_one_round(tmp_path / method.method_name, method)
    for key in fedavg:
        torch.testing.assert_close(other[key], fedavg[key], rtol=1e-5, atol=1e-6)


def test_feddyn_small_alpha_round_is_fedavg_clients_plus_the_drift(tmp_path):
    """As α → 0 the clients train as FedAvg's; the server adds (1/N)·Σ_{k∈S}(w_k − w_g) to the average."""
    seen = {}

    class Spy(FedDyn):
        def server_update(self, server, average, uploads):
            seen.update(w_g={k: v.clone() for k, v in server.global_weights.items()}, avg=dict(average))
            return super().server_update(server, average, uploads)

    fed = {"aggregation": "uniform"}  # every client sampled, uniform p_k: (1/N)·Σ(w_k − w_g) = average − w_g
    _, _, fedavg = tiny_run(tmp_path / "a", rounds=1, data_kwargs={"partition": "iid"}, fed_kwargs=fed)
    _, _, feddyn = tiny_run(
        tmp_path / "d",
        method=Spy,
        rounds=1,
        data_kwargs={"partition": "iid"},
        fed_kwargs=fed,
        model_kwargs={"alpha": 1e-9},
    )
    for key, value in fedavg.state_dict().items():
        if torch.is_floating_point(value):
            torch.testing.assert_close(seen["avg"][key], value, rtol=1e-5, atol=1e-6)
    for name, _ in feddyn.named_parameters():
        expected = 2 * seen["avg"][name] - seen["w_g"][name]
        torch.testing.assert_close(feddyn.state_dict()[name], expected, rtol=1e-4, atol=1e-5)


def _metrics(fed):
    return [(row["global_acc"], row["global_loss"], row["train_loss"]) for row in fed.recorder.history]


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
@pytest.mark.parametrize("name", sorted(METHODS))
def test_interrupted_run_resumes_identically(tmp_path, name):
    kwargs = {
        "method": METHODS[name],
        "data_kwargs": {"holdout_per_class": 5, "num_clients": 4},
        "model_kwargs": {"aux_per_class": 5} if name == "fedssd" else None,
        "fed_kwargs": {"sample_ratio": 0.5, "lr_decay": 0.9},
    }
    _, full, full_model = tiny_run(tmp_path / "full", rounds=3, **kwargs)
    tiny_run(tmp_path / "cut", rounds=1, **kwargs)  # the resume trains two rounds
    ckpt = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    _, resumed, resumed_model = tiny_run(tmp_path / "cut", rounds=3, ckpt_path=str(ckpt), **kwargs)
    assert len(resumed.recorder.history) == 3
    assert _metrics(resumed) == _metrics(full)
    for key, value in full_model.state_dict().items():
        assert torch.equal(resumed_model.state_dict()[key], value), key


def test_baseline_configs_exist_and_name_the_method():
    import yaml

    root = Path(__file__).resolve().parent.parent
    for name, cls in BASELINES.items():
        for setting in ("fmnist_shard2", "fmnist_lda01", "cifar10_shard2", "cifar10_dir05"):
            config = yaml.safe_load((root / "configs" / f"{name}_{setting}.yaml").read_text())
            assert config["model"]["class_path"] == f"fl_lightning.methods.{cls.__name__}"
    for name in ("scaffold", "fednova"):
        config = yaml.safe_load((root / "configs" / f"{name}_fmnist_lda005.yaml").read_text())
        assert config["data"]["alpha"] == 0.05
    compare = yaml.safe_load((root / "configs/compare/fmnist_ntd_setting.yaml").read_text())
    assert set(BASELINES) <= set(compare["methods"])


@pytest.mark.parametrize("name", ["scaffold", "feddyn", "fednova", "fedcurv"])
def test_a_frozen_parameter_stays_out_of_a_methods_parameter_state(tmp_path: Path, name: str) -> None:
    """Control variates, dual variables and Fisher cover the trainable parameters: a frozen layer trains as FedAvg's."""
    from helpers import bare_trainer

    from fl_lightning import FederatedDataModule, Federation
    from fl_lightning.core.models import build_model

    finals = []
    for engine in ("sequential", "batched"):
        torch.manual_seed(0)
        net = build_model("lenet", 1, 8, 10)
        frozen = next(net.parameters()).requires_grad_(False)
        before = frozen.detach().clone()
        model = METHODS[name](net=net, lr=0.05)
        dm = FederatedDataModule("digits", num_clients=4, batch_size=64)
        fed = Federation(rounds=2, engine=engine, plots=False)
        bare_trainer(tmp_path / engine, fed).fit(model, datamodule=dm)
        assert fed.engine_used == engine  # batched, not a fallback to sequential
        assert torch.equal(frozen.detach(), before)
        finals.append(model.state_dict())
    for key, value in finals[0].items():
        torch.testing.assert_close(finals[1][key], value, atol=1e-5, rtol=1e-5)


def test_a_checkpoint_whose_sgd_lists_frozen_parameters_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Before frozen parameters were left out of the local SGD, checkpoints listed them: such a run still resumes."""
    from helpers import bare_trainer

    from fl_lightning import FederatedDataModule, Federation
    from fl_lightning.core.models import build_model

    def fit(rounds: int, ckpt_path: str | None) -> Federation:
        torch.manual_seed(0)
        net = build_model("lenet", 1, 8, 10)
        next(net.parameters()).requires_grad_(False)
        fed = Federation(rounds=rounds, plots=False)
        dm = FederatedDataModule("digits", num_clients=4, batch_size=64)
        bare_trainer(tmp_path, fed, enable_checkpointing=True).fit(FedAvg(net=net, lr=0.05), dm, ckpt_path=ckpt_path)
        return fed

    with monkeypatch.context() as patch:  # the old SGD: every parameter, frozen ones too
        patch.setattr(FedAvg, "configure_optimizers", lambda self: torch.optim.SGD(self.parameters(), lr=0.05))
        fit(1, None)
    assert [row["round"] for row in fit(2, "last").history] == [1, 2]


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_a_feddyn_checkpoint_whose_h_covers_frozen_parameters_resumes(tmp_path: Path, engine: str) -> None:
    """Before frozen parameters were left out of FedDyn's h, checkpoints held them: such a run resumes, as if new."""
    from helpers import bare_trainer

    import fl_lightning.methods as methods_module
    from fl_lightning import FederatedDataModule, Federation
    from fl_lightning.core.models import build_model

    def fit(root: Path, rounds: int, ckpt_path: str | None, engine: str = "sequential") -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        net = build_model("lenet", 1, 8, 10)
        next(net.parameters()).requires_grad_(False)
        model = METHODS["feddyn"](net=net, lr=0.05)
        fed = Federation(rounds=rounds, engine=engine, sample_ratio=1.0, plots=False)
        dm = FederatedDataModule("digits", num_clients=4, batch_size=64)
        bare_trainer(root, fed, enable_checkpointing=True).fit(model, dm, ckpt_path=ckpt_path)
        return model.state_dict()

    with pytest.MonkeyPatch.context() as patch:  # the old FedDyn: h over every parameter, frozen ones too
        patch.setattr(methods_module, "trainable", lambda module: list(module.named_parameters()))
        fit(tmp_path / "old", 1, None)
    callbacks = torch.load(tmp_path / "old/checkpoints/last.ckpt", weights_only=False)["callbacks"]
    (old,) = [state for key, state in callbacks.items() if key.startswith("Federation")]
    every = sum(p.numel() for p in build_model("lenet", 1, 8, 10).parameters())
    assert old["server_state"]["h"].numel() == every, "the simulated old checkpoint's h is not over every parameter"
    resumed = fit(tmp_path / "old", 2, "last", engine)
    fresh = fit(tmp_path / "new", 2, None)
    for key, value in fresh.items():
        torch.testing.assert_close(resumed[key], value, atol=1e-6, rtol=1e-6)


def test_a_parameter_state_that_fits_no_network_is_refused_by_size() -> None:
    """A state vector of neither the network's parameters nor its trainable ones names both sizes."""
    from fl_lightning.core.models import build_model
    from fl_lightning.methods import _trainable_part

    net = build_model("lenet", 1, 8, 10)
    with pytest.raises(ValueError, match="5 entries does not fit this network's 21386 trainable parameters"):
        _trainable_part(torch.zeros(5), net)
