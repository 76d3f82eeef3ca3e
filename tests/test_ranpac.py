"""RanPAC: the ridge algebra against direct solves, the reference's lambda rule, the seeded projection kept in the
checkpoint, one adapted pass per image (its first session is APER's), parameter formulas, and refusals.

Mechanics on the tiny random ViT (``vit_micro``, 64-d) with tiny data; the profiles, the ``--set`` check and the
slow test on the embedded benchmark with the real offline ViT are tests/test_method_profiles.py's, shared with APER.
The clbench cache (``CLBENCH_CACHE``) is isolated per session by ``conftest.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tinytasks import PassCounter, check_one_adapted_pass_per_image, check_param_formula_after_a_real_run, ctx_for

import baselines.ranpac as ranpac_mod
from baselines.aper import APER, APERConfig
from baselines.ranpac import RIDGE_GRID, RanPAC, RanPACConfig, ridge_losses, select_ridge, solve_ridge
from clbench.cli import main
from clbench.errors import ClbenchError
from clbench.features.backbones import load_backbone
from clbench.methods.contract import Context
from clbench.run.checkpoint import CHECKPOINT_FILE, load, save

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

RANPAC_SMALL = RanPACConfig(M=96, epochs=1, batch_size=8, eval_batch_size=4, bottleneck=8)
APER_SMALL = APERConfig(epochs=1, batch_size=8, eval_batch_size=4, bottleneck=8)
MICRO = ["--backbone", "vit_micro", "--weights", "random", "--init-cls", "12", "--increment", "12"]


# ----------------------------------------------------------------------------------------------- fixtures
TASK_CLASSES = ([0, 1], [2, 3])  # two equal tasks: the classes of tinytasks' `tasks` and `test_split`


# ----------------------------------------------------------------------------------------------- ridge algebra
def synthetic(n: int, M: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """h = ReLU(f W) of noisy class clusters, and their one-hot targets (float32)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centres = torch.randn(classes, 12, generator=g)
    f = centres[labels] + 1.5 * torch.randn(n, 12, generator=g)
    H = F.relu(f @ torch.randn(12, M, generator=g))
    return H, F.one_hot(labels, classes).float()


@pytest.mark.parametrize("numerics", ["exact", "reference"])
def test_ridge_solution_equals_a_direct_closed_form_solve(numerics):
    H, Y = synthetic(40, 16, 3, seed=0)
    G, Q = H.T @ H, H.T @ Y
    for lam in (1e-2, 1.0, 1e3):
        wo = solve_ridge(G, Q, lam, numerics)  # (C, M)
        direct = np.linalg.solve(G.double().numpy() + lam * np.eye(16), Q.double().numpy()).T
        assert wo.shape == (3, 16)
        np.testing.assert_allclose(wo.numpy(), direct, rtol=2e-3, atol=1e-6)
        # the normal equations hold: (G + lam I) Wo^T = Q
        resid = (G.double() + lam * torch.eye(16, dtype=torch.float64)) @ wo.double().T - Q.double()
        assert float(resid.abs().max()) < 1e-3 * float(Q.abs().max())


def reference_rule(H: np.ndarray, Y: np.ndarray) -> tuple[float, list[float]]:
    """optimise_ridge_parameter restated: grid 10^-8..10^8; fit on rows [0, int(0.8 n)), MSE on the rest; argmin."""
    ridges = 10.0 ** np.arange(-8, 9)
    n_fit = int(H.shape[0] * 0.8)
    Ha, Hb, Ya, Yb = H[:n_fit], H[n_fit:], Y[:n_fit], Y[n_fit:]
    losses = []
    for ridge in ridges:
        wo = np.linalg.solve(Ha.T @ Ha + ridge * np.eye(H.shape[1]), Ha.T @ Ya).T
        losses.append(float(np.mean((Hb @ wo.T - Yb) ** 2)))
    return float(ridges[int(np.argmin(losses))]), losses


@pytest.mark.parametrize("n,M", [(60, 20), (30, 80)])  # more fitting rows than M (primal) and fewer (dual)
def test_lambda_choice_equals_the_reference_rule(n, M):
    H, Y = synthetic(n, M, 4, seed=n + M)
    want, want_losses = reference_rule(H.double().numpy(), Y.double().numpy())
    assert 1e-8 < want < 1e8  # an interior choice, so the grid's ends cannot pass by accident
    got = select_ridge(H, Y)
    assert got == want
    np.testing.assert_allclose(ridge_losses(H, Y), want_losses, rtol=1e-4)
    assert len(RIDGE_GRID) == 17 and RIDGE_GRID[0] == 1e-8 and RIDGE_GRID[-1] == 1e8
    if n * 0.8 > M:  # well conditioned: the reference's float32 solves choose the same
        assert select_ridge(H, Y, "reference") == want


def test_the_floor_restricts_the_grid_to_lambdas_the_float32_statistics_resolve():
    H, Y = synthetic(30, 80, 4, seed=110)
    losses = ridge_losses(H, Y)
    best = select_ridge(H, Y)
    floor = best * 3  # the unrestricted choice is now below the floor
    above = [lam for lam in RIDGE_GRID if lam >= floor]
    want = min(above, key=lambda lam: losses[RIDGE_GRID.index(lam)])
    assert select_ridge(H, Y, floor=floor) == want and want > best
    assert select_ridge(H, Y, floor=1e9) == 1e8  # nothing allowed: the largest grid value
    G = (H.T @ H).float()
    assert ranpac_mod.ridge_floor(G) == pytest.approx(torch.finfo(torch.float32).eps * float(G.diagonal().sum()))


def test_lambda_split_uses_the_given_order_first_80_percent_fit():
    H, Y = synthetic(50, 30, 4, seed=5)
    flipped = torch.flip(H, [0]), torch.flip(Y, [0])  # other rows fit: in general another loss curve
    assert ridge_losses(H, Y) != ridge_losses(*flipped)
    assert select_ridge(*flipped) == reference_rule(flipped[0].double().numpy(), flipped[1].double().numpy())[0]


def test_a_task_too_small_to_split_is_refused():
    H, Y = synthetic(1, 8, 1, seed=0)
    with pytest.raises(ClbenchError, match="80/20"):
        select_ridge(H, Y)


# ----------------------------------------------------------------------------------------------- RanPAC strategy
def test_statistics_are_accumulated_gram_and_class_sums_and_wo_solves_them(backbone, tasks):
    s = RanPAC(RANPAC_SMALL, ctx_for(backbone))
    hs, ys = [], []
    for task in tasks:
        s.learn_task(task)
        h = F.relu(s.features(task.train) @ s.W)
        hs.append(h)
        ys.append(F.one_hot(task.train.labels, 4).float())
    H, Y = torch.cat(hs), torch.cat(ys)
    torch.testing.assert_close(s.G, H.T @ H, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(s.Q, H.T @ Y, rtol=1e-4, atol=1e-3)
    assert s.W.shape == (backbone.num_features, 96) and s.Wo.shape == (4, 96)
    direct = np.linalg.solve(s.G.double().numpy() + s.lambdas[-1] * np.eye(96), s.Q.double().numpy()).T
    np.testing.assert_allclose(s.Wo.numpy(), direct, rtol=1e-3, atol=1e-6)
    assert len(s.lambdas) == 2 and all(lam in RIDGE_GRID for lam in s.lambdas)
    assert all(lam >= floor > 0 for lam, floor in zip(s.lambdas, s.floors, strict=True))
    assert s.floors[-1] == ranpac_mod.ridge_floor(s.G)


def test_plain_head_is_the_inner_product_and_cosine_head_is_pilots(backbone, tasks, test_split):
    plain = RanPAC(RANPAC_SMALL, ctx_for(backbone))
    cosine = RanPAC(RanPACConfig(**{**RANPAC_SMALL.__dict__, "head": "cosine"}), ctx_for(backbone))
    for s in (plain, cosine):
        s.learn_task(tasks[0])
    h = F.relu(plain.features(test_split).double() @ plain.W.double())
    torch.testing.assert_close(plain.predict(test_split), (h @ plain.Wo.double().T).float())
    h = F.relu(cosine.features(test_split).double() @ cosine.W.double())
    want = cosine.sigma * F.normalize(h, dim=1) @ F.normalize(cosine.Wo.double(), dim=1).T
    assert cosine.sigma != 1.0  # learnt in the first session and kept, as PILOT's update_fc carries it
    torch.testing.assert_close(cosine.predict(test_split), want.float())
    assert not torch.equal(plain.predict(test_split), cosine.predict(test_split))


def test_projection_is_fixed_by_the_seed_and_kept_in_the_state(backbone, tasks):
    a, b, c = (RanPAC(RANPAC_SMALL, ctx_for(backbone, seed)) for seed in (7, 7, 8))
    assert torch.equal(a.W, b.W) and not torch.equal(a.W, c.W)
    assert abs(float(a.W.mean())) < 0.1 and abs(float(a.W.std()) - 1) < 0.1  # N(0, 1)
    a.learn_task(tasks[0])
    w = a.W.clone()
    state = a.state_dict()
    assert torch.equal(state["W"], w)
    c.load_state_dict(state)  # built with another seed: the saved projection wins
    assert torch.equal(c.W, w)


def test_resumed_run_keeps_the_projection_and_the_record(tmp_path, monkeypatch, capsys):
    args = [*MICRO, "--set", "epochs=1", "--set", "M=64", "--train-per-class", "8", "--precision", "fp32"]
    assert main(["run", "--strategy", "ranpac", *args, "--out", str(tmp_path / "ref")]) == 0
    ref = json.loads((tmp_path / "ref" / "result.json").read_text())

    class Stop(Exception):
        pass

    learn = RanPAC.learn_task

    def stop_at(self, task):
        if task.id == 2:
            raise Stop
        learn(self, task)

    out = tmp_path / "run"
    with monkeypatch.context() as m, pytest.raises(Stop):
        m.setattr(RanPAC, "learn_task", stop_at)
        main(["run", "--strategy", "ranpac", *args, "--out", str(out)])
    saved = load(out / CHECKPOINT_FILE).strategy
    fresh = torch.randn(64, 64, generator=Context(None, torch.device("cpu"), "fp32", 1993).generator(5000))
    assert torch.equal(saved.tensors[saved.tree["W"]["$tensor"]], fresh)  # the seeded projection, in the checkpoint
    assert main(["run", "--resume", str(out)]) == 0
    resumed = json.loads((out / "result.json").read_text())
    assert resumed["accuracy_matrix"] == ref["accuracy_matrix"] and resumed["params"] == ref["params"]
    assert resumed["resumed_from_task"] == [2]
    assert [e["diagnostics"] for e in resumed["per_task"]] == [e["diagnostics"] for e in ref["per_task"]]


def test_a_resumed_run_on_another_width_is_refused(tmp_path, monkeypatch, capsys):
    args = [*MICRO, "--set", "epochs=1", "--set", "M=64", "--precision", "fp32"]
    out = tmp_path / "run"

    class Stop(Exception):
        pass

    learn = RanPAC.learn_task

    def stop_at(self, task):
        if task.id == 1:
            raise Stop
        learn(self, task)

    with monkeypatch.context() as m, pytest.raises(Stop):
        m.setattr(RanPAC, "learn_task", stop_at)
        main(["run", "--strategy", "ranpac", *args, "--out", str(out)])
    ckpt = load(out / CHECKPOINT_FILE)
    ckpt.strategy.tensors[ckpt.strategy.tree["W"]["$tensor"]] = torch.randn(32, 64)  # as saved from a 32-d backbone
    save(out / CHECKPOINT_FILE, ckpt)
    capsys.readouterr()
    assert main(["run", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert "32-d backbone features, but this backbone gives 64-d" in err and "--overwrite" in err
    with pytest.raises(ClbenchError, match="128-d backbone features"):
        APER(APER_SMALL, ctx_for(load_backbone("vit_micro", "random", seed=0))).load_state_dict({"dim": 128})


def test_a_projection_too_large_for_memory_is_refused_with_the_estimate(backbone, monkeypatch, tmp_path, capsys):
    with pytest.raises(ClbenchError, match=r"M=1000000: .* need about 335\d\d\.\d GiB"):
        RanPAC(RanPACConfig(M=1_000_000), ctx_for(backbone))
    monkeypatch.setattr(ranpac_mod, "available_memory", lambda: 2**30)  # 1 GiB free
    with pytest.raises(ClbenchError, match=r"need about 3\.7 GiB .* only 1\.0 GiB") as e:
        RanPAC(RanPACConfig(M=10_000), ctx_for(backbone))
    fits = int(e.value.hint.split("M=")[-1].split()[0])
    assert 3000 < fits < 10_000
    RanPAC(RanPACConfig(M=fits), ctx_for(backbone))  # the hint's M is accepted
    with pytest.raises(ClbenchError):
        RanPAC(RanPACConfig(M=fits + 200), ctx_for(backbone))
    # through the CLI: refused before a task is learnt, one line with the estimate
    code = main(["run", "--strategy", "ranpac", *MICRO, "--set", "M=100000", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "M=100000" in err and "GiB" in err and "task 1/" not in err


def test_ranpac_without_phase_1_passes_no_image_through_the_vit(backbone, tasks, test_split):
    s = RanPAC(RanPACConfig(**{**RANPAC_SMALL.__dict__, "first_session": False}), ctx_for(backbone))
    count = PassCounter(backbone.model)
    try:
        for task in tasks:
            s.learn_task(task)
            s.predict(test_split)
    finally:
        count.close()
    assert count.grad == count.nograd == 0
    assert s.param_counts().trainable_per_task == [0, 0]
    h = F.relu(tasks[1].train.features @ s.W)  # the frozen cached features feed the projection
    assert torch.allclose(F.relu(s.features(tasks[1].train) @ s.W), h)


# ----------------------------------------------------------------------------------------------- one pass per image
@pytest.mark.parametrize("method", ["ranpac"])
def test_after_task_0_every_image_passes_the_adapted_vit_once(backbone, tasks, test_split, method):
    s = RanPAC(RANPAC_SMALL, ctx_for(backbone))
    check_one_adapted_pass_per_image(s, backbone, tasks, test_split)


# ----------------------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize(
    "strategy,overrides",
    [("ranpac", (("M", "200"),)), ("ranpac", (("M", "200"), ("first_session", "false")))],
)
def test_param_formula_equals_the_counts_after_a_real_run(tmp_path, strategy, overrides):
    check_param_formula_after_a_real_run(tmp_path, strategy, overrides)


def test_work_counts_one_adapted_pass_per_image_and_task_0_training_only():
    from clbench.methods.contract import RunShape

    shape = RunShape((400.0, 200.0, 200.0), (100.0, 150.0, 200.0))
    aper = APER.card.cost(APERConfig(), shape)
    assert (aper.f, aper.b, aper.f_cacheable) == (2 * (800 + 200), 20 * 400, 800 + 200)
    r = RanPAC.card.cost(RanPACConfig(M=1000), shape)
    assert (r.f, r.b, r.f_cacheable) == (aper.f, aper.b, aper.f_cacheable)
    no_phase_1 = RanPAC.card.cost(RanPACConfig(M=1000, first_session=False), shape)
    assert (no_phase_1.f, no_phase_1.b) == (1000, 0)
    ci = RunShape((100.0, 30.0), (5.0, 12.0), classes_per_task=(4, 2), train_per_class=16)  # 64 and 30 images learnt
    assert APER.card.cost(APERConfig(epochs=2), ci).b == 2 * 64
    assert RanPAC.card.cost(RanPACConfig(epochs=2), ci).f == (130 + 12) + (94 + 12)


# ----------------------------------------------------------------------------------------------- configs
def test_configs_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="M must"):
        RanPACConfig(M=0)
    with pytest.raises(ValueError, match="head"):
        RanPACConfig(head="linear")
    with pytest.raises(ValueError, match="ridge_numerics"):
        RanPACConfig(ridge_numerics="fast")
