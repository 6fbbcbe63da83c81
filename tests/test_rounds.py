"""The round core without a Trainer: planning, process shares, the round's reduce and evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.core.evaluation import Evaluation, add_counts, batch_counts, evaluate
from fl_lightning.core.rounds import RoundPlan, RoundState, client_steps, num_sampled, plan_round, process_share

SIZES = [37, 5, 120, 64, 9, 50, 77, 13, 20, 31]


def _plan(r: int, seed: int = 0, ratio: float = 0.3, **kw) -> RoundPlan:
    args = dict(seed=seed, client_sizes=SIZES, sample_ratio=ratio, batch_size=16, local_epochs=2, lr_decay=0.9)
    return plan_round(r, **{**args, **kw})


# ---- planning -------------------------------------------------------------------------------------------------------


def test_plan_is_a_pure_function_of_seed_and_round():
    assert _plan(3) == _plan(3)
    assert _plan(3, seed=1) != _plan(3)
    assert len({_plan(r).clients for r in range(10)}) > 1


def test_plan_samples_sorted_distinct_clients_with_their_steps_and_lr():
    for r in range(20):
        plan = _plan(r)
        assert len(plan.clients) == num_sampled(len(SIZES), 0.3) == 3
        assert list(plan.clients) == sorted(set(plan.clients))
        assert plan.steps == tuple(client_steps(SIZES[c], 16, 2) for c in plan.clients)
        assert plan.lr_scale == pytest.approx(0.9**r)
        assert plan.round == r and plan.local_epochs == 2


def test_plan_with_full_participation_and_drop_last():
    plan = _plan(0, ratio=1.0, drop_last=True)
    assert plan.clients == tuple(range(len(SIZES)))
    assert plan.steps == tuple(2 * (n // 16) for n in SIZES)


def test_plan_matches_the_recorded_sampling():
    # Round 0 of seed 0 with 10 of 100 clients: what every run since the first release sampled.
    plan = plan_round(0, seed=0, client_sizes=[600] * 100, sample_ratio=0.1, batch_size=50, local_epochs=5)
    rng = np.random.default_rng(int(np.random.SeedSequence([0, 0]).generate_state(1, np.uint64)[0]) >> 1)
    assert plan.clients == tuple(sorted(int(c) for c in rng.choice(100, 10, replace=False)))
    assert plan.steps == (60,) * 10


def test_client_steps():
    assert client_steps(50, 16, 1) == 4
    assert client_steps(50, 16, 3, drop_last=True) == 9
    assert client_steps(0, 16, 2) == 0


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_process_shares_cover_the_round_once_and_are_padded_to_equal_length(world):
    plan = _plan(1, ratio=0.8)
    shares = [process_share(plan, rank, world) for rank in range(world)]
    slots = sorted(s for share, _ in shares for s in share)
    assert slots == list(range(len(plan.clients)))
    lengths = {len(local.clients) for _, local in shares}
    assert len(lengths) == 1  # every process takes as many training batches
    for share, local in shares:
        assert local.clients[: len(share)] == tuple(plan.clients[s] for s in share)
        assert local.steps[: len(share)] == tuple(plan.steps[s] for s in share)
        assert set(local.clients[len(share) :]) <= {-1} and set(local.steps[len(share) :]) <= {0}
    loads = [sum(local.steps) for _, local in shares]
    assert max(loads) - min(loads) <= max(plan.steps)  # LPT balance


def test_a_single_process_trains_the_whole_plan():
    plan = _plan(2)
    assert process_share(plan) == (list(range(len(plan.clients))), plan)


def test_more_processes_than_clients_is_refused():
    with pytest.raises(ValueError, match="cannot be shared"):
        process_share(_plan(0, ratio=0.1), 0, 2)


# ---- the round's state and reduce -----------------------------------------------------------------------------------


def test_batches_start_and_end_clients_in_both_batch_modes():
    plan = RoundPlan(0, clients=(4, 7, -1), steps=(3, 2, 0), local_epochs=1, lr_scale=1.0)
    per_client = RoundState(plan, slots=[0, 1], weights=[0.5, 0.5], batches_per_client=[1, 1, 1])  # the third pads
    assert [per_client.client_starting(b) for b in range(3)] == [0, 1, None]
    assert [per_client.client_ending(b) for b in range(3)] == [0, 1, None]
    assert [per_client.is_last_batch(b) for b in range(3)] == [False, False, True]
    per_step = RoundState(plan, slots=[0, 1], weights=[0.5, 0.5], batches_per_client=plan.steps)
    assert [per_step.client_starting(b) for b in range(5)] == [0, None, None, 1, None]
    assert [per_step.client_ending(b) for b in range(5)] == [None, None, 0, None, 1]
    assert [per_step.is_last_batch(b) for b in range(5)] == [False, False, False, False, True]


def test_reduce_is_the_weighted_average_and_the_reduced_uploads():
    plan = RoundPlan(0, clients=(0, 1, 2), steps=(1, 1, 1), local_epochs=1, lr_scale=1.0)
    rnd = RoundState(plan, slots=[0, 1, 2], weights=[0.2, 0.3, 0.5], upload_reduce={"n": "sum"})
    values = [1.0, 2.0, 4.0]
    for pos in (2, 0, 1):  # any order
        w = {"w": torch.tensor([values[pos], -values[pos]]), "count": torch.tensor(pos + 10)}
        upload = {"d": torch.tensor([values[pos]]), "n": torch.tensor(1.0)}
        rnd.step_loss(torch.tensor(values[pos]))
        assert rnd.add_client(pos, w, upload, rnd.client_loss(), client=pos, state={"pos": pos})
        rnd.client_starting(0)  # the next client starts with no losses
    average, uploads = rnd.reduce({"w": torch.float32, "count": torch.int64})
    expected = 0.2 * 1.0 + 0.3 * 2.0 + 0.5 * 4.0
    torch.testing.assert_close(average["w"], torch.tensor([expected, -expected]))
    assert int(average["count"]) == 10  # integer entries: the first slot's, not averaged
    torch.testing.assert_close(uploads["d"], torch.tensor([expected], dtype=torch.float32))
    assert float(uploads["n"]) == 3.0  # "sum" keys are summed
    assert rnd.train_loss == pytest.approx(np.mean(values))
    assert rnd.client_states == {0: {"pos": 0}, 1: {"pos": 1}, 2: {"pos": 2}}


def test_a_non_finite_client_is_left_out_and_reported():
    plan = RoundPlan(0, clients=(0, 1), steps=(1, 1), local_epochs=1, lr_scale=1.0)
    rnd = RoundState(plan, slots=[0, 1], weights=[0.5, 0.5])
    assert rnd.add_client(0, {"w": torch.tensor([1.0])}, loss=0.1, client=0)
    assert not rnd.add_client(1, {"w": torch.tensor([float("nan")])}, loss=0.1, client=1)
    assert not rnd.add_client(1, {"w": torch.tensor([1.0])}, loss=float("inf"), client=1)
    assert rnd.gather_divergence() == ["client 1 produced a non-finite loss or weights"] * 2


def test_reduce_before_every_client_finished_is_an_error():
    plan = RoundPlan(4, clients=(0, 1), steps=(1, 1), local_epochs=1, lr_scale=1.0)
    rnd = RoundState(plan, slots=[0, 1], weights=[0.5, 0.5])
    rnd.add_client(0, {"w": torch.tensor([1.0])})
    with pytest.raises(RuntimeError, match="round 5 ended after 1 of its 2 clients"):
        rnd.reduce()


# ---- evaluation -----------------------------------------------------------------------------------------------------


def _data(n: int = 53, d: int = 4, c: int = 3) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    model = nn.Linear(d, c)
    x = torch.randn(n, d, generator=gen)
    return model, x, torch.randint(0, c, (n,), generator=gen)


def test_evaluate_equals_a_direct_computation_whatever_the_batching():
    model, x, y = _data()
    with torch.no_grad():
        logits = model(x)
    loss = F.cross_entropy(logits, y).item()
    hits = logits.argmax(1) == y
    class_acc = [hits[y == k].float().mean().item() for k in range(3)]
    for batch in (1, 7, 53, 100):
        batches = [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(y), batch)]
        result = evaluate(model, batches, num_classes=3)
        assert result.loss == pytest.approx(loss, rel=1e-6)
        assert result.acc == pytest.approx(hits.float().mean().item())
        np.testing.assert_allclose(result.class_acc, class_acc, rtol=1e-6)


def test_evaluate_applies_the_transform_and_restores_training_mode():
    model, x, y = _data()
    model.train()
    plain = evaluate(model, [(x * 2, y)], num_classes=3)
    halved = evaluate(model, [(x, y)], num_classes=3, transform=lambda t: t * 2)
    assert (plain.loss, plain.acc) == (halved.loss, halved.acc)
    assert (plain.loss, plain.acc) != (evaluate(model, [(x, y)], num_classes=3).loss, plain.acc)
    assert model.training


def test_shards_sum_to_the_whole():
    model, x, y = _data()
    batches = [(x[i : i + 10], y[i : i + 10]) for i in range(0, len(y), 10)]
    whole = evaluate(model, batches, num_classes=3)
    counts = None
    for rank in range(3):  # what three processes evaluate, summed by hand (no process group here)
        with torch.no_grad():
            for i, (xb, yb) in enumerate(batches):
                if i % 3 == rank:
                    counts = add_counts(counts, batch_counts(model(xb), yb, 3))
    summed = Evaluation.from_counts(counts)
    assert summed.acc == whole.acc and summed.loss == pytest.approx(whole.loss, rel=1e-12)


def test_a_class_absent_from_the_data_scores_zero():
    counts = batch_counts(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), torch.tensor([0, 0]), 3)
    result = Evaluation.from_counts(counts)
    assert result.acc == 0.5 and result.class_acc.tolist() == [0.5, 0.0, 0.0]


@pytest.mark.parametrize(("n", "world", "batch"), [(21, 2, 4), (5, 4, 1), (7, 3, 5), (6, 3, 2)])
def test_evaluation_shares_without_padding_count_every_sample_once(n: int, world: int, batch: int) -> None:
    """Lightning's DistributedSampler pads the processes' shares; ``unpadded`` keeps each sample once over them."""
    from torch.utils.data import DistributedSampler

    from fl_lightning.core.evaluation import unpadded

    counted: list[int] = []
    for rank in range(world):
        share = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False))
        seen = 0
        for start in range(0, len(share), batch):
            part = share[start : start + batch]
            counted += part[: unpadded(DistributedSampler(range(n), world, rank, shuffle=False), seen, len(part))]
            seen += len(part)
    assert sorted(counted) == list(range(n))


# ---- sampling, aggregation and metrics against their definitions -----------------------------------------------------


def test_clients_per_round_is_ratio_times_n_rounded_not_floored():
    assert num_sampled(10, 0.37) == 4  # round(3.7)
    assert num_sampled(20, 0.29) == 6  # round(5.8)
    assert num_sampled(10, 0.01) == 1  # at least one
    plan = plan_round(0, seed=0, client_sizes=[5] * 10, sample_ratio=0.37, batch_size=5, local_epochs=1)
    assert len(plan.clients) == 4 == len(set(plan.clients))


def test_integer_buffers_come_from_the_first_client_of_the_round_whatever_order_they_finish_in():
    from fl_lightning.core.aggregation import StateAccumulator

    acc = StateAccumulator()
    acc.add({"w": torch.tensor([2.0]), "n": torch.tensor(30)}, 0.5, order=2)
    acc.add({"w": torch.tensor([4.0]), "n": torch.tensor(10)}, 0.25, order=0)
    acc.add({"w": torch.tensor([8.0]), "n": torch.tensor(20)}, 0.25, order=1)
    out = acc.result()
    assert int(out["n"]) == 10  # slot 0's counter, though slot 2 finished first
    assert out["w"].item() == pytest.approx(0.5 * 2 + 0.25 * 4 + 0.25 * 8)


def test_forgetting_degree_default_xi_keeps_a_class_the_global_model_misses_finite():
    from fl_lightning.core.metrics import forgetting_degree

    tau = forgetting_degree(np.array([0.0, 0.5]), np.array([0.0, 0.25]))
    np.testing.assert_allclose(tau, [0.0, 0.25 / (0.5 + 1e-3)])
