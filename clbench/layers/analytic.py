"""Closed-form heads on frozen features: a fixed random expansion with an activation, and least-squares (ridge)
classifiers over it, solved jointly from accumulated statistics or recursively (RanPAC, ACIL, DS-AL).

- :func:`relu_projection`: h = ReLU(f W) (RanPAC's projection, ACIL's buffer layer).
- :func:`uniform_expansion`: W ~ U(-1/sqrt(d), 1/sqrt(d)), (d, M): ``torch.nn.Linear``'s default initialisation,
  which the analytic-learning reference (``RandomBuffer``) keeps.
- :func:`ridge_solution`: the joint ridge solve (G + lambda I)^-1 Q in float64 over accumulated G = sum h^T h and
  Q = sum h^T Y (RanPAC's head; the invariant ACIL's recursion must meet).
- :class:`AnalyticRidge`: ACIL's and DS-AL's classifier, that joint ridge solution after every batch, in its dual
  form (stacked per-batch factors of the autocorrelation, an r x r solve) while that is the cheaper form,
  else by the recursion below.
- :class:`RecursiveRidge`: the recursive least-squares classifier of ACIL (Zhuang et al., NeurIPS 2022, eqs. 9-10;
  G-ACIL's mini-batch form): R = (sum h^T h + gamma I)^-1 and W = R sum h^T Y updated per batch, never seeing an
  old sample again; after any sequence of batches W equals the joint ridge solve with lambda = gamma.
- :func:`available_memory`, :func:`memory_estimate`, :func:`check_memory`: the one-line refusal of a buffer width
  whose float64 R matrices would not fit (ACIL, DS-AL; RanPAC has its own estimate for its float32 Gram matrix).
- :func:`growth_measurement`: a ``clbench perf`` measurement of an analytic method's seconds and peak memory on
  synthetic features from the embedded benchmark's shape up to 200 classes / 10 tasks.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import psutil
import torch
import torch.nn.functional as F

from clbench.errors import ClbenchError
from clbench.layers.checks import SOLVERS
from clbench.methods.contract import Context, Split, Task
from clbench.perf import Measurement, arg


def relu_projection(f: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """h = ReLU(f W): (N, d), (d, M) -> (N, M) in ``f``'s dtype."""
    return F.relu(f @ W.to(f.dtype))


def uniform_expansion(d: int, M: int, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(d, M) weights ~ U(-1/sqrt(d), 1/sqrt(d)): the bound of ``nn.Linear.reset_parameters`` (Kaiming-uniform with
    a = sqrt(5) gives gain sqrt(1/3), bound sqrt(3) gain / sqrt(fan_in) = 1 / sqrt(d)), drawn from ``generator``."""
    bound = 1.0 / math.sqrt(d)
    w = torch.empty(d, M, dtype=torch.float64)
    w.uniform_(-bound, bound, generator=generator)
    return w.to(dtype)


def ridge_solution(G: torch.Tensor, Q: torch.Tensor, lam: float) -> torch.Tensor:
    """(G + lam I)^-1 Q in float64: (M, M), (M, C) -> (M, C), by a Cholesky factorisation (an LU solve where rounding
    makes the system indefinite). ``G`` is left as it is (a float64 ``G`` is copied, not shifted in place)."""
    a = G.to(torch.float64, copy=True)
    a.diagonal().add_(lam)
    factor, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0:
        return torch.cholesky_solve(Q.double(), factor)
    del factor  # positive definite in exact arithmetic; rounding made it indefinite: solve by LU instead
    return torch.linalg.solve(a, Q.double())


def available_memory() -> int:
    return int(psutil.virtual_memory().available)


def memory_estimate(M: int, d: int, batch: int, streams: int = 1) -> int:
    """Bytes a recursive analytic classifier of buffer width M needs beyond the harness: per stream R (8 M^2 float64)
    and its serialised copy in the checkpoint (8 M^2), so 16 M^2 per stream; plus the buffer (8 d M), a batch's X,
    U and V and a prediction block (4 x 8 n M). Checked against the measured peak RSS in
    ``reports/perf/acil-growth.json`` and ``reports/perf/dsal-growth.json``."""
    return streams * 16 * M * M + 8 * d * M + 4 * 8 * batch * M


def check_memory(method: str, M: int, d: int, batch: int, streams: int = 1) -> None:
    """Refuse, in one line with the estimate, a buffer width whose R matrices do not fit in available memory."""
    need, free = memory_estimate(M, d, batch, streams), available_memory()
    if need > free:
        rest = free - 8 * d * M - 32 * batch * M
        fit = int(math.sqrt(rest / (16 * streams))) // 256 * 256 if rest > 0 else 0
        raise ClbenchError(
            f"{method} with M={M}: {streams} R matrix(es) of M x M float64 and the checkpoint need about "
            f"{need / 2**30:.1f} GiB (~{16 * streams} M^2 bytes), but only {free / 2**30:.1f} GiB is available",
            f"lower M (--set M=...); about {fit} fits now",
        )


def _spd_factor(a: torch.Tensor, what: str, matrix: str, gamma: float) -> torch.Tensor:
    """The Cholesky factor of ``a``, or the one-line refusal that asks for a larger gamma (``matrix`` names it)."""
    factor, info = torch.linalg.cholesky_ex(a)
    if int(info) != 0:
        raise ClbenchError(
            f"{what}: {matrix} is not positive definite in float64 (gamma={gamma:g}), so the least-squares "
            "solution is rounding noise",
            "increase gamma (--set gamma=...)",
        )
    return factor


def _check_finite(W: torch.Tensor, what: str, gamma: float) -> None:
    if not bool(torch.isfinite(W).all()):
        raise ClbenchError(
            f"{what}: the least-squares weights are not finite (gamma={gamma:g})", "increase gamma (--set gamma=...)"
        )


class RecursiveRidge:
    """The recursive least-squares (analytic) classifier: R (M, M) float64 and W (M, C) float64.

    Starts at R = I / gamma, W = 0 (no class). ``fit(X, Y)`` with a batch of n expanded features X (n, M) and
    targets Y (n, C'), C' >= the classes so far (new columns of W start at 0), does ACIL's eqs. (10) and (9):

        R <- R - R X^T (I + X R X^T)^-1 X R,      W <- W + R X^T (Y - X W)   (the new R)

    computed as U = R X^T (M, n), S = I + X U (n, n, positive definite), V = S^-1 U^T by a Cholesky solve, then
    R <- R - U V and W <- W + V^T (Y - X W), because (new R) X^T = U - U S^-1 X U = U S^-1. That is 4 n M^2 flops
    per batch and no M x M temporary (the reference's ``R @ X.T @ K @ X @ R``, left to right, forms an M x M
    product and multiplies it by R: 2 M^3 flops). Float64 throughout,
    as the reference (``AnalyticLinear(dtype=torch.double)``): R is the inverse of a Gram matrix whose condition
    number grows with the data, and each update subtracts nearly equal numbers.
    """

    def __init__(self, M: int, gamma: float) -> None:
        self.gamma = float(gamma)
        self.R = torch.eye(M, dtype=torch.float64) / self.gamma  # (M, M)
        self.W = torch.zeros(M, 0, dtype=torch.float64)  # (M, C)

    @property
    def n_classes(self) -> int:
        return int(self.W.shape[1])

    def grow(self, n_classes: int) -> None:
        """Add zero columns up to ``n_classes`` (the reference's ``tail`` of zeros)."""
        if n_classes > self.n_classes:
            tail = torch.zeros(self.W.shape[0], n_classes - self.n_classes, dtype=torch.float64)
            self.W = torch.cat([self.W, tail], dim=1)

    def fit(self, X: torch.Tensor, Y: torch.Tensor, what: str = "the analytic classifier") -> None:
        """One recursive update with the batch (X, Y): (n, M), (n, C') with C' >= ``n_classes`` (fewer columns
        are padded with zeros, as the reference)."""
        X, Y = X.double(), Y.double()
        self.grow(Y.shape[1])
        if Y.shape[1] < self.n_classes:
            Y = torch.cat([Y, Y.new_zeros(Y.shape[0], self.n_classes - Y.shape[1])], dim=1)
        U = self.R @ X.T  # (M, n)
        S = X @ U  # (n, n)
        S.diagonal().add_(1.0)
        factor = _spd_factor(S, what, "I + X R X^T", self.gamma)
        V = torch.cholesky_solve(U.T.contiguous(), factor)  # (n, M) = S^-1 U^T
        E = Y - X @ self.W  # (n, C) residual of the old weights on the batch
        self.R.addmm_(U, V, alpha=-1.0)  # eq. (10)
        self.W += V.T @ E  # eq. (9): (new R) X^T (Y - X W)
        _check_finite(self.W, what, self.gamma)

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        """Logits X W: (N, M) -> (N, C) float64."""
        return X.double() @ self.W


def dual_flops(rows: int, n: int, M: int) -> float:
    """The dual form's update with a batch of n on ``rows`` rows: X X^T and the rotation (4 n^2 M), the Gram's new
    block (2 n rows M) and the bordered Cholesky factor (n rows^2 + n^3 / 3)."""
    return 4 * n * n * M + 2 * n * rows * M + n * rows * rows + n**3 / 3


def recursive_flops(n: int, M: int) -> float:
    """The recursion's update with a batch of n: U = R X^T and R -= U V (4 n M^2)."""
    return 4 * n * M * M


def switch_flops(rows: int, M: int) -> float:
    """Forming R from the dual form's ``rows`` factors: F^T F (2 M^2 rows), its Cholesky and inverse (M^3)."""
    return 2 * M * M * rows + M**3


class AnalyticRidge:
    """The analytic classifier W = (sum X^T X + gamma I)^-1 sum X^T Y over every batch so far, exact after every
    update (ACIL's Theorem 1), in the cheaper of two forms; float64.

    - ``solver="recursive"``: the reference's recursion (:class:`RecursiveRidge`): R (M, M) from the start.
    - ``solver="auto"`` (default): the dual form while it is the cheaper (every task of the embedded benchmark: 2,320
      images against M = 8,192), then the recursion, switched to once (:meth:`_switch_now`). The dual form keeps the
      autocorrelation sum X^T X as a stack of per-batch factors ``factor`` (r, M): each batch X adds R_b = V^T X, V the
      (n, n) orthogonal eigenvectors of X X^T (so R_b^T R_b = X^T X and the rows of R_b are orthogonal), and its targets
      rotated the same way, V^T Y, to ``targets`` (r, C), so that factor^T targets = sum X^T Y; ``chol``, the Cholesky
      factor of factor factor^T + gamma I (r, r), is bordered by one block of rows per batch (the Gram itself is not
      kept). The weights follow from the push-through identity (F^T F + gamma I)^-1 F^T = F^T (F F^T + gamma I)^-1: W =
      factor^T (F F^T + gamma I)^-1 targets, an r x r Cholesky solve, its factor kept and bordered by each batch (n r^2
      + n^3 / 3 flops). Per batch of n on r rows: 4 n^2 M + 2 n r M + n r^2 + n^3 / 3 flops and an n x n eigh, not the
      recursion's 4 n M^2 (about 10 x fewer for the embedded benchmark at M = 8192), and r M + r^2 floats kept instead
      of M^2. No sample is kept: R_b is a factor of X^T X, from which a batch's images are recovered only up to an
      unknown rotation of the batch (a batch of one image gives its expanded features up to sign, as its X^T X does);
      what the dual form reveals beyond the recursion's single R is each batch's autocorrelation
      instead of only their sum.
    Both forms give the same W to float64 rounding (``tests/test_acil.py``); which one ran is in ``form``.
    """

    def __init__(self, M: int, gamma: float, solver: str = "auto") -> None:
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
        self.M = int(M)
        self.gamma = float(gamma)
        self.factor = torch.zeros(0, self.M, dtype=torch.float64)  # (r, M) stacked batch factors R_b
        self.targets = torch.zeros(0, 0, dtype=torch.float64)  # (r, C) stacked V_b^T Y_b
        self.chol = torch.zeros(0, 0, dtype=torch.float64)  # (r, r) lower Cholesky factor of F F^T + gamma I
        self.W = torch.zeros(self.M, 0, dtype=torch.float64)  # (M, C)
        self.excess_flops = 0.0  # what the dual form's updates cost beyond the recursion's (see _switch_now)
        self.recursive: RecursiveRidge | None = RecursiveRidge(self.M, self.gamma) if solver == "recursive" else None

    @property
    def form(self) -> str:
        return "recursive" if self.recursive is not None else "dual"

    @property
    def n_classes(self) -> int:
        return int(self.W.shape[1])

    def grow(self, n_classes: int) -> None:
        """Add zero columns up to ``n_classes`` (the reference's ``tail`` of zeros)."""
        if self.recursive is not None:
            self.recursive.grow(n_classes)
            self.W = self.recursive.W
            return
        extra = n_classes - self.n_classes
        if extra > 0:
            self.W = torch.cat([self.W, self.W.new_zeros(self.M, extra)], dim=1)
            self.targets = torch.cat([self.targets, self.targets.new_zeros(len(self.targets), extra)], dim=1)

    def fit(self, X: torch.Tensor, Y: torch.Tensor, what: str = "the analytic classifier") -> None:
        """Absorb the batch (X, Y): (n, M), (n, C') with C' >= ``n_classes`` (fewer columns are padded with zeros,
        as the reference); W is the joint ridge solution over every batch so far afterwards."""
        X, Y = X.double(), Y.double()
        self.grow(Y.shape[1])
        if Y.shape[1] < self.n_classes:
            Y = torch.cat([Y, Y.new_zeros(Y.shape[0], self.n_classes - Y.shape[1])], dim=1)
        if self.recursive is None and self._switch_now(len(X)):
            self._to_recursive(what)
        if self.recursive is not None:
            self.recursive.fit(X, Y, what)
            self.W = self.recursive.W
            return
        if not bool(torch.isfinite(X).all()):  # eigh would fail inside LAPACK
            raise ClbenchError(
                f"{what}: the expanded features hold NaN or inf",
                "check the backbone's features: the input images, and --precision (a bf16 overflow shows as inf)",
            )
        own = X @ X.T  # (n, n)
        _, V = torch.linalg.eigh(own)  # X X^T = V S V^T, V (n, n) orthogonal
        r = V.T @ X  # (n, M) the batch rotated: r^T r = X^T X, r^T (V^T Y) = X^T Y
        cross = r @ self.factor.T  # (n, r_old)
        block = V.T @ own @ V  # (n, n) r r^T (= S up to rounding), from the n x n product: no second n^2 M
        block = (block + block.T) / 2
        self._extend_factor(cross, block, what)
        self.factor = torch.cat([self.factor, r])
        self.targets = torch.cat([self.targets, V.T @ Y])
        self._solve(what)

    def _switch_now(self, n: int) -> bool:
        """Whether to leave the dual form before a batch of n: once the dual form's updates have cost more than the
        recursion's would have, by as much as forming R costs (a rent-or-buy rule: never more than twice the cost of
        the better choice in hindsight), or once its memory would exceed what the memory check allows for (R and
        its checkpoint copy, 2 M^2 floats): the factor and the Cholesky factor of r rows are r M + r^2 floats, and
        growing them copies both, so the dual form stops at r M + r^2 = M^2 (r = 0.62 M: 5,063 rows at M = 8,192;
        it held 12,800 rows, 4.9 GB, at 200 classes of 64 images without this bound)."""
        rows = len(self.factor)
        grown = rows + n
        if grown * self.M + grown * grown > self.M * self.M:
            return True
        self.excess_flops += max(0.0, dual_flops(rows, n, self.M) - recursive_flops(n, self.M))
        return self.excess_flops >= switch_flops(rows, self.M)

    def _gram_factor(self, what: str) -> torch.Tensor:
        """The Cholesky factor of F F^T + gamma I (r, r): the one kept, or, for a state saved before it was kept
        (which held the Gram F F^T as ``gram`` instead), factorised from that once."""
        chol = self.__dict__.get("chol")
        if chol is None or len(chol) != len(self.factor):
            gram = self.__dict__.pop("gram", None)
            a = (self.factor @ self.factor.T if gram is None else gram).clone()
            a.diagonal().add_(self.gamma)
            self.chol = _spd_factor(a, what, "F F^T + gamma I", self.gamma)
        return self.chol

    def _extend_factor(self, cross: torch.Tensor, block: torch.Tensor, what: str) -> None:
        """Border the kept Cholesky factor L of F F^T + gamma I with a batch's rows: the new factor is
        [[L, 0], [S, L2]] with S L^T = cross (a triangular solve) and L2 L2^T = block + gamma I - S S^T, so that
        each batch costs n r^2 + n^3 / 3 flops, not the (r + n)^3 / 3 of factorising the grown matrix again."""
        L = self._gram_factor(what)
        S = torch.linalg.solve_triangular(L, cross.T, upper=False).T if len(L) else cross  # (n, r)
        d = block - S @ S.T
        d.diagonal().add_(self.gamma)
        L2 = _spd_factor(d, what, "F F^T + gamma I", self.gamma)
        top = torch.cat([L, L.new_zeros(len(L), len(L2))], 1)
        self.chol = torch.cat([top, torch.cat([S, L2], 1)], 0)

    def _solve(self, what: str) -> None:
        factor = self._gram_factor(what)
        # (M, C) = factor^T alpha, formed as (alpha^T factor)^T: the same sums, but BLAS reads the (r, M) factor in
        # its own layout; ``factor.T @ alpha`` had it pack a transposed copy of the factor first, which took 2-20x
        # as long (up to 0.7 s at r = 2,000, M = 8,192) on a machine whose fresh memory is slow to fault in
        self.W = (torch.cholesky_solve(self.targets, factor).T @ self.factor).T
        _check_finite(self.W, what, self.gamma)

    def _to_recursive(self, what: str) -> None:
        """Switch to the recursion for good: R = (F^T F + gamma I)^-1 (an M x M Cholesky inverse, once), W as is."""
        a = self.factor.T @ self.factor  # (M, M)
        # empty tensors of their own, not [:0] views, which would keep the dual form's storage alive: the peak
        # stays at two M x M matrices (a and its factor, then the factor and R), as the memory check assumes
        self.factor = self.factor.new_zeros(0, self.M)
        self.targets = self.targets.new_zeros(0, self.n_classes)
        self.chol = self.chol.new_zeros(0, 0)
        a.diagonal().add_(self.gamma)
        chol = _spd_factor(a, what, "sum X^T X + gamma I", self.gamma)
        del a
        R = torch.cholesky_inverse(chol)
        del chol
        rec = RecursiveRidge(0, self.gamma)  # its I / gamma would be a third M x M matrix: R is set instead
        rec.R, rec.W = R, self.W
        self.recursive = rec

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        """Logits X W: (N, M) -> (N, C) float64."""
        return X.double() @ self.W

    def inverse_autocorrelation(self) -> torch.Tensor:
        """R = (sum X^T X + gamma I)^-1 (M, M), what the reference's recursion keeps: the recursion's own, or formed
        from the dual form's factors (M^3 flops: for tests and inspection, not used in learning)."""
        if self.recursive is not None:
            return self.recursive.R
        a = self.factor.T @ self.factor
        a.diagonal().add_(self.gamma)
        return torch.cholesky_inverse(torch.linalg.cholesky(a))


# ----------------------------------------------------------------------------------------------- growth measurement
GROWTH_SHAPES = (  # (classes, tasks, d): the embedded benchmark's shape (ViT-S/14), then 200 classes / 10 tasks
    (36, 6, 384),
    (200, 10, 384),
    (200, 10, 768),
)
GROWTH_TRAIN, GROWTH_TEST = 64, 26  # images per class: the embedded benchmark's ~64 train, ~26 test (942 / 36)


def _growth_one(strategy_cls: type, config: object, classes: int, tasks: int, d: int, seed: int) -> dict[str, Any]:
    """One synthetic run in this process: class means ~ N(0, I), images = mean + N(0, I); learn every task, predict
    all seen test images after each (as the harness); seconds and the peak RSS above the RSS before the strategy
    was built (``resource.getrusage``'s ``ru_maxrss``, so this runs in a fresh process)."""
    import resource
    import time
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, d, generator=g) * 2

    def split(n_per: int, cls: range) -> Split:
        y = torch.tensor([c for c in cls for _ in range(n_per)], dtype=torch.long)
        z = means[y] + torch.randn(len(y), d, generator=g)
        return Split(None, np.arange(len(y)), y, z.float(), None, None)  # type: ignore[arg-type]

    per = classes // tasks
    trains = [split(GROWTH_TRAIN, range(t * per, (t + 1) * per)) for t in range(tasks)]
    tests = [split(GROWTH_TEST, range(0, (t + 1) * per)) for t in range(tasks)]
    base = psutil.Process().memory_info().rss
    ctx = Context(SimpleNamespace(num_features=d), torch.device("cpu"), "fp32", seed, log=lambda s: None)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    strategy = strategy_cls(config, ctx)
    learn = predict = 0.0
    correct = 0
    for t in range(tasks):
        a = time.perf_counter()
        strategy.learn_task(Task(t, list(range(t * per, (t + 1) * per)), (t + 1) * per, trains[t]))
        b = time.perf_counter()
        logits = strategy.predict(tests[t])
        predict += time.perf_counter() - b
        learn += b - a
        correct = int((logits.argmax(1) == tests[t].labels).sum())
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return {
        "classes": classes,
        "tasks": tasks,
        "d": d,
        "train_images": classes * GROWTH_TRAIN,
        "test_images_last": classes * GROWTH_TEST,
        "learn_s": round(learn, 3),
        "predict_s": round(predict, 3),
        "total_s": round(time.perf_counter() - t0, 3),
        "peak_rss_above_start_mib": round((peak_kib * 1024 - base) / 2**20, 1),
        "final_accuracy_synthetic": round(correct / (classes * GROWTH_TEST), 4),
    }


def _growth_child(args: tuple[type, object, int, int, int, int], out: Any) -> None:
    out.put(_growth_one(*args))


def growth(strategy_cls: type, config: object, shapes: tuple[tuple[int, int, int], ...] = GROWTH_SHAPES) -> dict:
    """Each shape in a fresh (spawned) process, so that its peak RSS is its own."""
    import dataclasses
    import multiprocessing as mp

    rows = []
    spawn = mp.get_context("spawn")
    for classes, tasks, d in shapes:
        queue = spawn.Queue()
        p = spawn.Process(target=_growth_child, args=((strategy_cls, config, classes, tasks, d, 1993), queue))
        p.start()
        row = queue.get()
        p.join()
        row["estimate_mib"] = round(
            memory_estimate(
                int(config.M),
                d,
                min(int(config.il_batch_size), classes // tasks * GROWTH_TRAIN),
                int(getattr(strategy_cls, "streams", 1)),
            )
            / 2**20,
            1,
        )
        rows.append(row)
    return {
        "strategy": strategy_cls.name,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],  # other processes on the machine share its cores
        "config": dataclasses.asdict(config),  # type: ignore[call-overload]
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "memory": "peak resident set size (ru_maxrss) of a fresh process above its RSS before the strategy is built",
        "rows": rows,
    }


def growth_measurement(strategy_cls: type, name: str, config: object) -> Any:
    """The ``clbench perf NAME`` measurement of :func:`growth` at ``config`` (the reference's defaults)."""

    def run(flags: Any) -> dict[str, Any]:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in flags.shapes.split(","))
        return {"benchmark": name, **growth(strategy_cls, config, shapes)}  # type: ignore[arg-type]

    default = ",".join("x".join(str(v) for v in shape) for shape in GROWTH_SHAPES)
    return Measurement(
        name,
        help=f"{strategy_cls.name}'s seconds and peak memory at the reference's buffer width, 36 to 200 classes",
        run=run,
        args=(arg("--shapes", default=default, help=f"CLASSESxTASKSxD,... (default {default})"),),
    )
