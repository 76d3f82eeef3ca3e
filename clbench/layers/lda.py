"""Streaming linear discriminant analysis on frozen features (SLDA, RanDumb): running class means, one covariance
shared by all classes, its shrinkage, and the solve that turns them into a linear head.

Everything is float64: the shared covariance of ViT features has eigenvalues spread over many orders of magnitude
(condition numbers of 1e6 and more after a 1e-4 shrinkage), so the head's solve loses most of float32's digits.

Two ways of updating the covariance, one per method's reference:

- :meth:`LDAStatistics.update_per_sample` (SLDA, Avalanche ``StreamingLDA.fit``): one rank-1 update per sample in
  arrival order, Sigma_{t+1} = (t Sigma_t + w_t d_t d_t^T) / (t + 1) with d_t = x_t - mu_y (the class mean before the
  sample). ``rule="reference"`` is Avalanche's (= Hayes and Kanan's eq.): w_t = t / (t + 1) with t the number of samples
  seen in all, and mu_y = 0 for a class's first sample (the zero-initialised mean); ``rule="exact"`` is Welford's update
  of the pooled within-class scatter: w_t = k / (k + 1) with k the samples of class y seen before, so Sigma is exactly
  the biased pooled within-class covariance. Both are computed for a whole batch at once (the d_t from per-class running
  sums, then one weighted product), which is the sequential recursion reordered. :meth:`LDAStatistics.start_oas` (SLDA's
  authors' ``fit_base``) starts them instead from a first batch taken at once: class means, counts, and the OAS-shrunk
  covariance of the within-class residuals, counted as that many samples.
- :meth:`LDAStatistics.add_classes_oas` (RanDumb, scikit-learn ``LinearDiscriminantAnalysis(solver="lsqr",
  covariance_estimator=OAS())``): each class's own OAS-shrunk covariance, weighted by the class's share of the samples.
  A class's images all arrive in one task (class-incremental), so its OAS estimate is final when the class arrives; the
  running sum of n_c * OAS_c divided by the samples seen is scikit-learn's ``_class_cov`` of all data seen so far. That
  sum is kept in low-rank form (scaled centred rows, their Gram matrix and an identity part) while there are fewer rows
  than dimensions, and the head solved by the Woodbury identity (:meth:`LDAStatistics.head`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from clbench.errors import ClbenchError

F64 = torch.float64


class LDAStatistics:
    """Class means (C, d), class counts (C,), and the shared covariance's running sum, all float64; classes are rows
    in arrival order (label = row). Sigma = (``scatter`` + ``rows``^T ``rows`` + ``ridge`` I) / ``n_cov``.

    The per-sample updates (SLDA) add to ``scatter`` (d, d). The per-class OAS updates (RanDumb) keep their sum in
    low-rank form while fewer sample rows than dimensions have arrived: ``rows`` (n, d) holds every class's centred
    samples scaled by sqrt(1 - s_c), ``gram`` = rows rows^T (n, n), and ``ridge`` = sum_c n_c s_c tr(S_c) / d the
    identity part; the head is then solved by the Woodbury identity in an n x n system instead of a d x d one (at
    the reference's d = 10,000 random features and a few thousand images: ~100 x fewer flops, 4 x less memory).
    Once the rows outnumber the dimensions they are folded into ``scatter`` (``rows^T rows``) for good.
    """

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.means = torch.zeros(0, dim, dtype=F64)  # (C, d)
        self.counts = torch.zeros(0, dtype=F64)  # (C,) samples per class
        self.scatter = torch.zeros(0, 0, dtype=F64)  # (d, d) dense part of n_cov * Sigma; (0, 0) until first used
        self.rows = torch.zeros(0, dim, dtype=F64)  # (n, d) low-rank part: sqrt(1 - s_c) (x - mu_c), class by class
        self.gram = torch.zeros(0, 0, dtype=F64)  # (n, n) rows rows^T
        self.ridge = 0.0  # the identity part of the sum: sum_c n_c s_c tr(S_c) / d
        self.low_rank_done = False  # the rows outnumbered the dimensions once: the sum is dense from then on
        self.n_cov = 0  # samples the covariance has absorbed
        self.n = 0  # samples seen in all (= the sum of counts)

    def grow(self, n_classes: int) -> None:
        """Rows for classes up to ``n_classes`` (zero means, zero counts: Avalanche's ``muK``/``cK`` start)."""
        extra = n_classes - self.means.shape[0]
        if extra > 0:
            self.means = torch.cat([self.means, torch.zeros(extra, self.dim, dtype=F64)])
            self.counts = torch.cat([self.counts, torch.zeros(extra, dtype=F64)])

    def dense_sum(self) -> torch.Tensor:
        """``scatter``, allocated (d x d zeros) on first use: a low-rank run at a large width (RanDumb's 10,000 random
        features) never holds, or checkpoints, the 8 d^2 bytes of a dense sum it does not use."""
        if self.scatter.shape != (self.dim, self.dim):
            self.scatter = torch.zeros(self.dim, self.dim, dtype=F64)
        return self.scatter

    def covariance(self) -> torch.Tensor:
        """(d, d) float64 shared covariance (zero before any sample)."""
        cov = self.dense_sum().clone()
        if len(self.rows):
            cov.addmm_(self.rows.T, self.rows)
        cov.diagonal().add_(self.ridge)
        return cov.div_(max(self.n_cov, 1))

    def head(self, log_priors: torch.Tensor | None, what: str, fix: str) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`lda_head` of the current statistics; by the Woodbury identity while the sum is low-rank:
        (R^T R + r I)^-1 = (I - R^T (R R^T + r I)^-1 R) / r, so Sigma^-1 mu = n_cov (mu - R^T (G + r I)^-1 R mu) / r."""
        if not len(self.rows):
            return lda_head(self.covariance(), self.means, log_priors, what, fix)
        if self.ridge <= 0.0:
            raise ClbenchError(f"{what}: the shared covariance is singular (not positive definite)", fix)
        a = self.gram.clone()
        a.diagonal().add_(self.ridge)
        rm = self.rows @ self.means.T  # (n, C)
        mt = self.means.T - self.rows.T @ solve_spd(a, rm, what, fix)  # (d, C)
        weight = (mt * (self.n_cov / self.ridge)).T.contiguous()  # (C, d)
        bias = -0.5 * (self.means * weight).sum(1)
        return weight, bias if log_priors is None else bias + log_priors.to(F64)

    def priors(self) -> torch.Tensor:
        """(C,) class frequencies of the samples seen (scikit-learn's ``priors_``)."""
        return self.counts / self.counts.sum()

    # ------------------------------------------------------------------------------------------ SLDA
    def update_per_sample(self, x: torch.Tensor, y: torch.Tensor, rule: str = "exact", sigma: bool = True) -> None:
        """Absorb samples ``x`` (N, d) with labels ``y`` (N,) in this order, one rank-1 covariance update each
        (``sigma=False``: means and counts only, Avalanche's ``streaming_update_sigma=False``)."""
        x = x.to(F64)
        y = y.long()
        self.grow(int(y.max()) + 1 if len(y) else 0)
        t = self.n + torch.arange(len(y), dtype=F64)  # (N,) samples seen before each one, all classes
        diff = torch.empty_like(x)  # (N, d) x_t - mu_y before x_t
        k = torch.empty(len(y), dtype=F64)  # (N,) samples of y seen before x_t
        for c in torch.unique(y).tolist():
            pos = torch.nonzero(y == c).squeeze(1)
            xc = x[pos]  # (n_c, d)
            before = self.counts[c] + torch.arange(len(pos), dtype=F64)  # (n_c,)
            sums = self.counts[c] * self.means[c] + torch.cumsum(xc, 0) - xc  # (n_c, d) sums of the earlier ones
            mu = torch.where(before[:, None] > 0, sums / before.clamp_min(1)[:, None], self.means[c])
            diff[pos] = xc - mu
            k[pos] = before
            total = self.counts[c] + len(pos)
            self.means[c] = (self.counts[c] * self.means[c] + xc.sum(0)) / total
            self.counts[c] = total
        if sigma:
            w = t / (t + 1) if rule == "reference" else k / (k + 1)  # (N,)
            self.dense_sum().addmm_(diff.T, diff * w[:, None])
            self.n_cov += len(y)
        self.n += len(y)

    def start_oas(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Start the statistics from a first batch ``x`` (N, d), labels ``y`` (N,), taken all at once (Hayes and
        Kanan's ``StreamingLDA.fit_base``): each class's mean and count, and the covariance the OAS-shrunk estimate
        of the within-class residuals x - mu_y (scikit-learn ``OAS(assume_centered=True)``), weighted as N samples
        seen, so that the per-sample updates that follow continue from it. Returns the OAS shrinkage."""
        if self.n:
            raise ValueError("start_oas starts empty statistics; these have absorbed samples already")
        x = x.to(F64)
        y = y.long()
        self.grow(int(y.max()) + 1 if len(y) else 0)
        for c in torch.unique(y).tolist():
            self.means[c] = x[y == c].mean(0)
            self.counts[c] = float((y == c).sum())
        centred = x - self.means[y]  # (N, d) within-class residuals
        n = len(y)
        scatter = centred.T @ centred  # (d, d) N S, S the empirical covariance about zero (assume_centered)
        mu = float(torch.trace(scatter)) / n / self.dim  # trace(S) / d
        alpha = float(scatter.pow(2).sum()) / (n * n) / (self.dim * self.dim)  # ||S||_F^2 / d^2
        s = 0.0 if self.dim == 1 else oas_coefficient(n, self.dim, mu, alpha)
        scatter.mul_(1.0 - s).diagonal().add_(n * s * mu)  # N ((1 - s) S + s mu I)
        self.dense_sum().copy_(scatter)
        self.n_cov = self.n = n
        return s

    # ------------------------------------------------------------------------------------------ RanDumb
    def add_classes_oas(self, x: torch.Tensor, y: torch.Tensor, classes: Sequence[int]) -> list[float]:
        """Absorb the complete samples of new ``classes``: mean, count and n_c * OAS_c(x of class c) added to the
        covariance sum. Returns each class's OAS shrinkage. Refuses a class with fewer than 2 samples."""
        x = x.to(F64)
        self.grow(max(classes) + 1)
        shrinkages, scaled = [], []
        for c in classes:
            xc = x[y == c]  # (n_c, d)
            n_c = len(xc)
            if n_c < 2:
                raise ClbenchError(
                    f"class {c} has {n_c} training image(s); its OAS covariance needs at least 2",
                    "use a larger --train-per-class (2 or more)",
                )
            mean = xc.mean(0)
            centred = xc - mean  # (n_c, d)
            s = oas_shrinkage(centred)
            mu = float(centred.pow(2).sum()) / n_c / self.dim  # trace(emp_cov) / d
            scaled.append(centred * (1.0 - s) ** 0.5)  # n_c (1 - s) emp_cov = (1 - s) X_c^T X_c
            self.ridge += n_c * s * mu  # n_c s mu I
            self.means[c] = mean
            self.counts[c] = n_c
            self.n_cov += n_c
            self.n += n_c
            shrinkages.append(s)
        self._add_rows(torch.cat(scaled))  # one update for the task's classes: one copy of the rows, not one per class
        return shrinkages

    def restore_rows(
        self, x: torch.Tensor, y: torch.Tensor, classes: Sequence[int], shrinkages: Sequence[float]
    ) -> None:
        """Rebuild the low-rank rows (and their Gram blocks) of ``classes``, already absorbed by
        :meth:`add_classes_oas` with these ``shrinkages``, from the same samples ``x`` (N, d): the same operations on
        the same numbers, so the same bits. A checkpoint keeps the (n, d_in) samples before the embedding instead
        of the (n, d) rows and (n, n) Gram (RanDumb: 384 instead of 10,000 + n floats per image)."""
        x = x.to(F64)
        self._add_rows(
            torch.cat(
                [(x[y == c] - self.means[c]) * (1.0 - s) ** 0.5 for c, s in zip(classes, shrinkages, strict=True)]
            )
        )

    def _add_rows(self, r: torch.Tensor) -> None:
        """Add r^T r (r: (k, d)) to the covariance sum: to the low-rank part while it has fewer rows than d, else
        (and from then on) to ``scatter``."""
        if len(self.rows) + len(r) >= self.dim or self.low_rank_done:
            if len(self.rows):  # fold the low-rank part in, once
                self.dense_sum().addmm_(self.rows.T, self.rows)
                self.rows, self.gram = self.rows[:0], self.gram[:0, :0]
            self.low_rank_done = True
            self.dense_sum().addmm_(r.T, r)
            return
        cross = r @ self.rows.T  # (k, n)
        self.gram = torch.cat([torch.cat([self.gram, cross.T], 1), torch.cat([cross, r @ r.T], 1)], 0)
        self.rows = torch.cat([self.rows, r])


def oas_shrinkage(centred: torch.Tensor) -> float:
    """The Oracle Approximating Shrinkage coefficient of scikit-learn's ``covariance.oas`` for the rows of
    ``centred`` (n, d), already centred, without forming the d x d empirical covariance S = X^T X / n:
    trace(S) = ||X||_F^2 / n and ||S||_F^2 = ||X X^T||_F^2 / n^2 (the n x n Gram matrix).
    mu = trace(S) / d, alpha = ||S||_F^2 / d^2, shrinkage = min((alpha + mu^2) / ((n + 1)(alpha - mu^2 / d)), 1),
    1 where the denominator is 0; d = 1 gives 0 (scikit-learn's special case)."""
    n, d = centred.shape
    if d == 1:
        return 0.0
    gram = centred @ centred.T  # (n, n)
    mu = float(torch.trace(gram)) / n / d
    alpha = float(gram.pow(2).sum()) / (n * n) / (d * d)
    return oas_coefficient(n, d, mu, alpha)


def oas_coefficient(n: int, d: int, mu: float, alpha: float) -> float:
    """OAS's shrinkage from n samples in d dimensions, mu = trace(S) / d and alpha = ||S||_F^2 / d^2 (scikit-learn's
    ``_oas``): min((alpha + mu^2) / ((n + 1)(alpha - mu^2 / d)), 1), 1 where the denominator is 0."""
    den = (n + 1) * (alpha - mu * mu / d)
    return 1.0 if den == 0 else min((alpha + mu * mu) / den, 1.0)


def shrink(cov: torch.Tensor, shrinkage: float) -> torch.Tensor:
    """(1 - shrinkage) Sigma + shrinkage I (SLDA's fixed shrinkage toward the identity)."""
    out = cov * (1.0 - shrinkage)
    out.diagonal().add_(shrinkage)
    return out


def solve_spd(a: torch.Tensor, rhs: torch.Tensor, what: str, fix: str) -> torch.Tensor:
    """a^-1 rhs for a symmetric positive definite ``a`` (float64 Cholesky); a clear error where ``a`` is singular
    (the reference's ``pinverse``/``lstsq`` would return a minimum-norm answer whose head is rounding noise)."""
    factor, info = torch.linalg.cholesky_ex(a.to(F64))
    if int(info) != 0:
        raise ClbenchError(
            f"{what}: the shared covariance is singular (not positive definite), so the LDA head is undefined",
            fix,
        )
    return torch.cholesky_solve(rhs.to(F64), factor)


def lda_head(
    cov: torch.Tensor, means: torch.Tensor, log_priors: torch.Tensor | None, what: str, fix: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The LDA head from a (d, d) covariance and (C, d) class means: weight = (Sigma^-1 mu_c)_c (C, d) and
    bias_c = -mu_c^T Sigma^-1 mu_c / 2 (+ log prior_c); logits = x weight^T + bias. Float64."""
    weight = solve_spd(cov, means.T, what, fix).T.contiguous()  # (C, d)
    bias = -0.5 * (means.to(F64) * weight).sum(1)  # (C,)
    if log_priors is not None:
        bias = bias + log_priors.to(F64)
    return weight, bias


def lda_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """(N, C) float32 logits x weight^T + bias, computed in float64 row by row (no dependence on the batch)."""
    return (x.to(F64) @ weight.T + bias).float()


def memory_estimate(width: int, n_batch: int, n_classes: int) -> int:
    """Bytes of the LDA statistics and head at feature width ``width`` in the dense form (the low-rank form of
    :class:`LDAStatistics` needs less while it lasts): the covariance sum, the shrunk copy the solve
    factors, its Cholesky factor and the checkpoint's copy of the sum (4 x 8 width^2, float64), plus a task's
    features and their centred/weighted copies (3 x 8 n_batch width) and the means, head and solve's right-hand
    side (3 x 8 n_classes width)."""
    return 32 * width * width + 24 * width * (n_batch + n_classes)


# ----------------------------------------------------------------------------------------------- perf measurement
GROWTH_SHAPES = (  # (classes, tasks, d): the embedded benchmark's shape, then 200 classes / 10 tasks at two widths
    (36, 6, 384),
    (200, 10, 384),
    (200, 10, 768),
)
GROWTH_TRAIN_PER_CLASS = 64  # ~ the embedded benchmark's training images per class
GROWTH_TEST_PER_CLASS = 26  # ~ its test images per class


class _Width:
    """The one attribute of a backbone these strategies read (``num_features``)."""

    def __init__(self, d: int) -> None:
        self.num_features = d
        self.model = None


def growth_run(strategy_cls: type, config: object, classes: int, tasks: int, d: int) -> dict[str, object]:
    """Fit ``strategy_cls(config)`` on synthetic Gaussian class clusters of width ``d`` task by task, predicting all
    seen test classes after each task (as the harness does). Seconds of ``learn_task`` and ``predict`` in all, and
    the peak resident memory above the start (psutil RSS sampled every 2 ms by a thread)."""
    import threading
    import time

    import psutil

    # deferred: loads numpy, which importing this module does not
    from clbench.methods.contract import Context, Split, Task

    g = torch.Generator().manual_seed(0)
    centres = torch.randn(classes, d, generator=g) * 2.0  # (C, d)
    n_tr, n_te = GROWTH_TRAIN_PER_CLASS, GROWTH_TEST_PER_CLASS
    y_tr = torch.arange(classes).repeat_interleave(n_tr)
    y_te = torch.arange(classes).repeat_interleave(n_te)
    x_tr = centres[y_tr] + torch.randn(len(y_tr), d, generator=g)
    x_te = centres[y_te] + torch.randn(len(y_te), d, generator=g)

    def split(x: torch.Tensor, y: torch.Tensor) -> Split:
        import numpy as np

        return Split(None, np.arange(len(y)), y, x, None, None)  # type: ignore[arg-type]  # features only

    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    ctx = Context(backbone=_Width(d), device=torch.device("cpu"), precision="fp32", seed=0, log=lambda s: None)  # type: ignore[arg-type]
    fit = pred = 0.0
    per = classes // tasks
    correct = 0.0
    try:
        strategy = strategy_cls(config, ctx)
        for t in range(tasks):
            lo, hi = t * per, classes if t == tasks - 1 else (t + 1) * per
            tr = (y_tr >= lo) & (y_tr < hi)
            te = y_te < hi
            start = time.perf_counter()
            strategy.learn_task(Task(t, list(range(lo, hi)), hi, split(x_tr[tr], y_tr[tr])))
            fit += time.perf_counter() - start
            start = time.perf_counter()
            logits = strategy.predict(split(x_te[te], y_te[te]))
            pred += time.perf_counter() - start
            correct = float((logits.argmax(1) == y_te[te]).float().mean())
    finally:
        done.set()
        sampler.join()
    return {
        "classes": classes,
        "tasks": tasks,
        "d": d,
        "train_per_class": n_tr,
        "test_per_class": n_te,
        "fit_seconds": round(fit, 3),
        "predict_seconds": round(pred, 3),
        "peak_rss_delta_mib": round((peak[0] - base) / 2**20, 1),
        "final_accuracy_synthetic": round(correct, 4),
    }


def growth_report(name: str, runs: list[dict[str, object]]) -> dict[str, object]:
    import platform

    return {
        "benchmark": name,
        "what": "learn_task over every task + predict of all seen test classes after each task, on synthetic "
        "features (Gaussian class clusters); memory = peak psutil RSS above the start, sampled every 2 ms",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "load_average_1min_at_end": round(__import__("os").getloadavg()[0], 2),  # a shared machine: context
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "runs": runs,
    }
