"""Routers: per-sample rules that choose, for every test image, one of a strategy's per-task modules.

A strategy that keeps one module per task (a module per task plus a shared head) and has no task id at test time
must pick a module per image. The rule is separate from the modules: training does not depend on it, so one
trained run can be evaluated under every rule (``--set routers=a,b,c``) and a routing study costs one training.

Each router is a small class registered by name (``ROUTERS``, the same :class:`~clbench.core.registry.Registry` as
strategies), with one method ``route(inputs) -> (N,)`` module indices. Rules read

- ``logits``: every module's logits on every image, (T, N, C) (the module is chosen by how its head answers);
- ``features``: the frozen backbone features, (N, d), and per-task statistics of the frozen *training* features
  (:class:`RoutingMemory`), fitted by the strategy right after each task on that task's training split only;
- ``task_id``: the true task of each image: ``oracle`` only, the upper bound of any rule.

Every rule is per-sample: a row's choice depends on its own image and the fitted statistics, never on other test
images or test labels (tests check invariance to shuffling and batch size).

Rules:
- ``entropy``: lowest softmax entropy (the rule of arXiv 2502.14762, with its reference code's +1e-9 in the log).
- ``max-logit``: highest top logit.
- ``energy``: highest log-sum-exp of the logits (lowest free energy, Liu et al. 2020, arXiv 2010.03759).
- ``margin``: highest top-1 minus top-2 logit.
- ``entropy-calibrated``: lowest entropy of ``logits / tau_t``, with one temperature per module fitted (NLL,
  a grid over log tau) on that module's logits for its own task's training images, right after the task.
- ``prototype``: the task whose mean frozen training feature is nearest (cosine).
- ``mahalanobis``: the task whose Gaussian on the frozen training features gives the smallest Mahalanobis
  distance, one covariance pooled over the tasks seen (each task's scatter added once, when it is learnt);
  shrunk towards a scaled identity (``SHRINKAGE``) since a task has fewer images than feature dimensions.
- ``mahalanobis-task``: the same with a per-task shrunk covariance and the log-determinant term (a full
  Gaussian likelihood per task).
- ``oracle``: each image's true task (a bound, never a method).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from clbench.core.config import split_list
from clbench.core.registry import Registry
from clbench.errors import ClbenchError
from clbench.records.routing_diagnostics import ModuleChoices, collapse_warning

SHRINKAGE = 0.1  # weight of the scaled identity in a shrunk covariance: (1 - a) S + a tr(S)/d I
TEMPERATURE_GRID = torch.logspace(-2, 2, 401, dtype=torch.float64)  # tau from 0.01 to 100, 1 % steps


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Softmax entropy over the last dim, with the reference's +1e-9 inside the log."""
    p = F.softmax(logits, dim=-1)
    return -(p * torch.log(p + 1e-9)).sum(dim=-1)


# ----------------------------------------------------------------------------------------------- statistics
@dataclass
class TaskStats:
    """What one task leaves for the routers, fitted on that task's training split right after it is learnt."""

    count: int  # training images
    mean: torch.Tensor  # (d,) float64, mean frozen feature
    precision: torch.Tensor  # (d, d) float64, inverse of the task's shrunk covariance
    logdet: float  # log-determinant of the task's shrunk covariance
    temperature: float  # the module's NLL-optimal temperature on its own training logits


@dataclass
class RoutingMemory:
    """Per-task statistics for the routers that need them; one entry per learnt task, in order. Part of the
    strategy's state, so checkpoints carry it; a run resumed from a checkpoint made without it cannot use the
    rules that need it (:meth:`require`)."""

    tasks: list[TaskStats] = field(default_factory=list)
    scatter_sum: torch.Tensor | None = None  # (d, d) float64, sum over tasks of sum_i (z_i - mu_t)(z_i - mu_t)^T
    shared_precision: torch.Tensor | None = None  # (d, d) float64, inverse of the pooled shrunk covariance

    def __len__(self) -> int:
        return len(self.tasks)

    def fit_task(self, task_id: int, features: torch.Tensor, labels: torch.Tensor, module_logits: torch.Tensor) -> None:
        """Add task ``task_id``'s statistics from its training split: frozen ``features`` (n, d), ``labels`` (n,)
        and the task's own module's ``module_logits`` (n, C) on those images."""
        if task_id != len(self.tasks):
            raise RuntimeError(f"routing statistics: task {task_id} fitted after {len(self.tasks)} tasks")
        z = features.double()
        n = z.shape[0]
        mean = z.mean(0)
        scatter = (z - mean).T @ (z - mean)  # (d, d)
        cov = _shrink(scatter / max(n - 1, 1))
        logdet = float(torch.linalg.slogdet(cov)[1])
        self.scatter_sum = scatter if self.scatter_sum is None else self.scatter_sum + scatter
        total = sum(t.count for t in self.tasks) + n
        self.shared_precision = torch.linalg.inv(_shrink(self.scatter_sum / max(total - len(self.tasks) - 1, 1)))
        self.tasks.append(TaskStats(n, mean, torch.linalg.inv(cov), logdet, fit_temperature(module_logits, labels)))

    def require(self, router: str, modules: int) -> None:
        """Raise a ClbenchError when ``router`` needs statistics this memory lacks for some of ``modules`` tasks."""
        if ROUTERS.get(router).needs_memory and len(self.tasks) < modules:
            raise ClbenchError(
                f"router {router!r} needs per-task routing statistics, and this run has them for {len(self.tasks)} "
                f"of its {modules} tasks (its checkpoint was written by a clbench that did not keep them)",
                "rerun the tasks: start the run over with --overwrite (or route with a rule that needs no "
                "statistics, e.g. --set router=entropy)",
            )


def _shrink(cov: torch.Tensor) -> torch.Tensor:
    d = cov.shape[0]
    return (1 - SHRINKAGE) * cov + SHRINKAGE * (torch.trace(cov) / d) * torch.eye(d, dtype=cov.dtype)


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature tau on ``TEMPERATURE_GRID`` minimising the NLL of softmax(logits / tau) for ``labels``."""
    x = logits.double()
    nll = torch.stack([F.cross_entropy(x / tau, labels.long()) for tau in TEMPERATURE_GRID])
    return float(TEMPERATURE_GRID[int(nll.argmin())])


# ----------------------------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class RouteInputs:
    logits: torch.Tensor  # (T, N, C) every module's logits on every image
    features: torch.Tensor | None = None  # (N, d) frozen backbone features
    memory: RoutingMemory | None = None  # statistics of the T tasks' training splits
    task_id: np.ndarray | None = None  # (N,) true task: the oracle bound only


class Router(ABC):
    """A per-sample rule. ``needs_memory``: reads :class:`RoutingMemory`; ``needs_task_id``: a bound, not a method;
    ``needs_all_modules``: reads every module's logits (else only the chosen module must run)."""

    name: ClassVar[str]
    needs_memory: ClassVar[bool] = False
    needs_task_id: ClassVar[bool] = False
    needs_all_modules: ClassVar[bool] = True

    @classmethod
    @abstractmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        """(N,) long: the chosen module of every image."""


ROUTERS: Registry[type[Router]] = Registry("router")


def register(name: str) -> Callable[[type[Router]], type[Router]]:
    def add(cls: type[Router]) -> type[Router]:
        cls.name = name
        return ROUTERS.register(name, cls)

    return add


@register("entropy")
class Entropy(Router):
    @classmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        return entropy(inp.logits).argmin(dim=0)


@register("max-logit")
class MaxLogit(Router):
    @classmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        return inp.logits.max(dim=-1).values.argmax(dim=0)


@register("energy")
class Energy(Router):
    @classmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        return torch.logsumexp(inp.logits, dim=-1).argmax(dim=0)


@register("margin")
class Margin(Router):
    @classmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        if inp.logits.shape[-1] < 2:  # one class: no margin to compare
            raise ClbenchError("router 'margin' needs at least 2 classes", "use another router for this run")
        top = inp.logits.topk(2, dim=-1).values  # (T, N, 2)
        return (top[..., 0] - top[..., 1]).argmax(dim=0)


@register("entropy-calibrated")
class EntropyCalibrated(Router):
    needs_memory = True

    @classmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        tau = torch.tensor([t.temperature for t in _memory(inp).tasks], dtype=inp.logits.dtype)  # (T,)
        return entropy(inp.logits / tau[:, None, None]).argmin(dim=0)


@register("prototype")
class Prototype(Router):
    needs_memory = True
    needs_all_modules = False

    @classmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        means = torch.stack([t.mean for t in _memory(inp).tasks])  # (T, d)
        z = F.normalize(_features(inp).double(), dim=1)
        return (z @ F.normalize(means, dim=1).T).argmax(dim=1)


@register("mahalanobis")
class Mahalanobis(Router):
    needs_memory = True
    needs_all_modules = False

    @classmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        mem = _memory(inp)
        z = _features(inp).double()
        dist = torch.stack([_maha(z, t.mean, mem.shared_precision) for t in mem.tasks])  # (T, N)
        return dist.argmin(dim=0)


@register("mahalanobis-task")
class MahalanobisTask(Router):
    needs_memory = True
    needs_all_modules = False

    @classmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        z = _features(inp).double()
        nll = torch.stack([_maha(z, t.mean, t.precision) + t.logdet for t in _memory(inp).tasks])  # (T, N)
        return nll.argmin(dim=0)


@register("oracle")
class Oracle(Router):
    needs_task_id = True
    needs_all_modules = False

    @classmethod
    def route(cls, inp: RouteInputs) -> torch.Tensor:
        if inp.task_id is None:
            raise ClbenchError(
                "router 'oracle' needs each image's true task: it is the bound of a routing study, not a method",
                "evaluate it with --set routers=...,oracle",
            )
        return torch.as_tensor(np.asarray(inp.task_id), dtype=torch.long)


def _maha(z: torch.Tensor, mean: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    diff = z - mean  # (N, d)
    return ((diff @ precision) * diff).sum(dim=1)  # (N,)


def _memory(inp: RouteInputs) -> RoutingMemory:
    if inp.memory is None or len(inp.memory) < inp.logits.shape[0]:
        have = 0 if inp.memory is None else len(inp.memory)
        raise ClbenchError(
            f"this router needs routing statistics for {inp.logits.shape[0]} tasks, found {have}",
            "rerun the tasks: start the run over with --overwrite",
        )
    return inp.memory


def _features(inp: RouteInputs) -> torch.Tensor:
    if inp.features is None:
        raise RuntimeError("this router needs the frozen features of the images")
    return inp.features


def route(name: str, inp: RouteInputs) -> torch.Tensor:
    """The chosen module of every image under router ``name`` (ClbenchError for an unknown name)."""
    return ROUTERS.get(name).route(inp)


def parse_names(text: str, setting: str) -> tuple[str, ...]:
    """``"a,b,c"`` -> registered router names in order, duplicates dropped (ClbenchError for an unknown one)."""
    if not text.strip():  # none: the setting's empty default
        return ()
    names = split_list(text, f"--set {setting}", "entropy,margin")
    for n in names:
        try:
            ROUTERS.check(n)
        except ClbenchError as e:
            raise ClbenchError(f"--set {setting}: {e.args[0]}", e.hint) from None
    return tuple(dict.fromkeys(names))


# ----------------------------------------------------------------------------------------------- diagnostics
def routing_summary(
    choice: torch.Tensor, all_logits: torch.Tensor, labels: np.ndarray, task_id: np.ndarray, router: str
) -> ModuleChoices:
    """Routing accuracy (overall and per true task), the true x chosen confusion counts, the chosen-module histogram,
    the newest module's share, the routed accuracy and any collapse warning, for one router's choices."""
    T = all_logits.shape[0]
    c = choice.numpy()
    pred = all_logits[choice, torch.arange(len(labels))].argmax(1).numpy()
    confusion = np.zeros((T, T), dtype=np.int64)
    np.add.at(confusion, (task_id, c), 1)
    return ModuleChoices(
        routing_acc=float((c == task_id).mean() * 100),
        routing_acc_per_task=[float((c[task_id == j] == j).mean() * 100) for j in range(T)],
        confusion=confusion.tolist(),  # rows: true task, columns: chosen module
        chosen_hist=np.bincount(c, minlength=T).tolist(),
        newest_module_share=float((c == T - 1).mean() * 100),
        acc=float((pred == labels).mean() * 100),
        collapse_warning=collapse_warning(c, task_id, T, router),
        study=True,
    )
