"""Planted bugs for ``tests/test_mutations.py``: realistic one-line mistakes in the eight methods, applied by
monkeypatching (no file is edited), and the unit tests of each method that must catch them.

Loaded as a pytest plugin (``-p mutations``) in a subprocess whose environment names one mutation in
``CLBENCH_MUTATION``: the patch is started in ``pytest_configure``, before any test module is imported, and holds
for the whole session, so the library code and the tests see the same planted bug.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import torch
import torch.nn.functional as F

import baselines.acil as acil_mod
import baselines.aper as aper_mod
import baselines.cl_lora as cl_lora_mod
import baselines.coda_prompt as coda_mod
import baselines.cofima as cofima_mod
import baselines.dsal as dsal_mod
import baselines.dualprompt as dualprompt_mod
import baselines.duct as duct_mod
import baselines.ease as ease_mod
import baselines.fecam as fecam_mod
import baselines.inflora as inflora_mod
import baselines.l2p as l2p_mod
import baselines.mos as mos_mod
import baselines.randumb as randumb_mod
import baselines.ranpac as ranpac_mod
import baselines.simplecil as simplecil_mod
import baselines.slda as slda_mod
import baselines.tuna as tuna_mod
import clbench.layers.first_session as first_session_mod
import clbench.layers.kan as kan_mod
import clbench.layers.lda as lda_mod
import clbench.layers.lora as lora_mod
import clbench.layers.prompts as prompts_mod
import clbench.layers.slow_learner as slow_learner_mod
import clbench.layers.ssf as ssf_mod
import clbench.layers.vpt as vpt_mod
import tosca.strategy as tosca_mod
from clbench.methods.shared import cosine_logits, vit_block, vit_tokens

ENV = "CLBENCH_MUTATION"


@dataclass(frozen=True)
class Mutation:
    method: str
    bug: str  # what the planted mistake is, in one line
    patch: Callable[[], contextlib.AbstractContextManager]


# ----------------------------------------------------------------------------------------------- SimpleCIL
def _normalised_means(features, labels, classes):  # prototypes: mean of L2-normalised features
    return REAL["class_means"](F.normalize(features, dim=-1), labels, classes)


def _dot_product_predict(self, split, protocol="per-sample"):  # logits: f . p_c instead of cos(f, p_c)
    return split.features @ self.head.weight.T


# ----------------------------------------------------------------------------------------------- L2P
def _pull_with_wrong_sign(self, images, query, batchwise):  # the training loss adds the pull instead of subtracting
    logits, pull = REAL["l2p_forward"](self, images, query, batchwise)
    return (logits, -pull) if torch.is_grad_enabled() else (logits, pull)


def _dot_product_keys(self, query):  # unnormalised keys: long keys win
    return F.normalize(query.float(), dim=-1) @ self.keys.T


# ----------------------------------------------------------------------------------------------- EASE / TOSCA
def _no_synthesis(protos, task_classes):  # old classes keep whatever stands in the new subspaces
    return protos.clone()


def _no_reweight(class_task, n_sets, alpha):  # every subspace weighted 1 (alpha / (T - 1) = 1)
    return REAL["subspace_weights"](class_task, n_sets, float(max(n_sets - 1, 1)))


def _l1_mean_epochs(self, task, module, optimizer, scheduler, advance):  # l1 term as a mean instead of a sum
    for epoch in range(self.cfg.epochs):
        for z, y in self._batches(task, epoch):
            params = torch.cat([p.flatten() for p in module.parameters()])
            loss = F.cross_entropy(self.head(module(z)), y) + self.cfg.l1 * params.abs().mean()
            tosca_mod.optimizer_step(optimizer, loss, "planted")
            if advance:
                advance(1)
        scheduler.step()


# ----------------------------------------------------------------------------------------------- RanPAC / APER
def _lambda_times_10(H, Y, numerics="exact", floor=0.0):
    return 10 * REAL["select_ridge"](H, Y, numerics, floor)


def _no_relu(self, f):  # h = f W without the ReLU
    return f @ self.W.to(f.dtype)


def _frozen_half_only(self, split, protocol="per-sample"):  # classify on the frozen half of concat(frozen, adapted)
    d = self.dim
    return cosine_logits(self.features(split)[:, :d], self.head.weight[:, :d])


def _adapted_store_bypassed(self, split):  # the frozen [CLS] feature used for both halves
    frozen = split.features.float()
    return torch.cat([frozen, frozen], dim=1)


def _ssf_scale_only(self, x):  # SSF's shift forgotten: x * scale
    return x * (self.scale.view(1, -1, 1, 1) if self.axis == 1 else self.scale).to(x.dtype)


def _vpt_first_prompts_in_every_block(self, model, images):  # deep VPT: block 0's prompts enter every block
    x = vit_tokens(model, images)
    b, n = x.shape[0], x.shape[1]
    for block in model.blocks:
        x = vit_block(block, torch.cat([x, self.prompts[0].expand(b, -1, -1)], dim=1))[:, :n]
    return model.forward_head(model.norm(x), pre_logits=True)


def _tuned_vit_left_frozen(self, model):  # adapt=finetune: the ViT copy keeps requires_grad False (head-only)
    torch.nn.Module.__init__(self)
    self.vit = copy.deepcopy(model)
    self.vit.requires_grad_(False)


# ----------------------------------------------------------------------------------------------- MOS
def _skip_post_step_merge(target, previous, momentum, in_place_data=False):  # adapter_merge() after a step skipped
    if in_place_data:  # the reference's in-forward drift is another call site
        REAL["merge_toward"](target, previous, momentum, in_place_data)


def _refine_one_round(feats, head, class_task, start_task, max_rounds):  # self-refinement never iterates
    return REAL["self_refine"](feats, head, class_task, start_task, 1)


def _unscaled_prototype_logits(refined, proto_logits, n_tasks, ensemble):  # softmax(proto) not scaled by t + 1
    return REAL["mos_output"](refined, proto_logits, 1, ensemble)


# ----------------------------------------------------------------------------------------------- DualPrompt
def _e_prompts_at_first_e_layer(self, images, slots):
    """DualPrompt._forward with one mistake: every E-prompt block gets the prefix of the first E-layer."""
    g_at = {layer: i for i, layer in enumerate(self.g_layers)}
    e_at = {layer: i for i, layer in enumerate(self.e_layers)}
    e = self.prompts.e[slots]  # (B, n_e, 2, L_e, d)
    B = len(images)
    with self.ctx.autocast():
        x = vit_tokens(self.model, images)
        for i, block in enumerate(self.model.blocks):
            if i in g_at:
                prefix = self.prompts.g[g_at[i]].unsqueeze(0).expand(B, -1, -1, -1)
            elif i in e_at:
                prefix = e[:, 0]  # planted: should be e[:, e_at[i]]
            else:
                prefix = None
            x = dualprompt_mod.prefix_block(block, x, prefix)
        x = self.model.norm(x)
        feat = self.model.forward_head(x, pre_logits=True)
    return self.head(feat.float())


def _key_value_swapped(attn, x, prefix):  # the prefix's value vectors used as keys and vice versa
    return REAL["prefix_attention"](attn, x, None if prefix is None else prefix.flip(1))


def _dot_product_e_keys(self, query):
    return F.normalize(query.float(), dim=-1) @ self.keys.T


def _keys_not_counted(cls, cfg, d, depth, task_sizes):  # the formula (and so the run's counts) forgets the E-keys
    counts = REAL["dualprompt_formula"](cfg, d, depth, task_sizes)
    return dataclasses.replace(
        counts,
        added_per_task=[n - d for n in counts.added_per_task],
        trainable_per_task=[n - d for n in counts.trainable_per_task],
    )


REAL = {
    "class_means": simplecil_mod.class_means,
    "dualprompt_formula": dualprompt_mod.DualPrompt.param_formula,
    "l2p_forward": l2p_mod.L2P._forward,
    "subspace_weights": ease_mod.subspace_weights,
    "select_ridge": ranpac_mod.select_ridge,
    "merge_toward": mos_mod.merge_toward,
    "self_refine": mos_mod.self_refine,
    "mos_output": mos_mod.mos_output,
    "prefix_attention": prompts_mod.prefix_attention,
    "rls_fit": acil_mod.RecursiveRidge.fit,
    "dual_fit": acil_mod.AnalyticRidge.fit,
    "lda_stats_head": lda_mod.LDAStatistics.head,
    "lda_start_oas": lda_mod.LDAStatistics.start_oas,
}


def _per_sample_as_reference(all_logits, batch):  # the reference protocol routes each sample on its own
    return tosca_mod.route_per_sample(all_logits)


def _batch_rule_as_per_sample(self, all_logits, protocol, split=None):  # both protocols route by batch-mean entropy
    return tosca_mod.route_reference(all_logits, self.cfg.ref_eval_batch)


# ----------------------------------------------------------------------------------------------- FeCAM
def _no_cov_normalisation(cov):  # the shrunk covariance used as it is, not as a correlation matrix
    return cov


def _unscaled_shrinkage(cov, alpha1, alpha2):  # alpha1 I added, not alpha1 x the mean variance
    return cov + alpha1 * torch.eye(cov.shape[0], dtype=cov.dtype)


def _unnormalised_features(f, cfg):  # statistics and distances on the raw features, not the L2-normalised ones
    return f.double()


# ----------------------------------------------------------------------------------------------- ACIL / DS-AL
def _acil_no_relu(self, f):  # the buffer layer without its ReLU
    return f.double() @ self.buffer


def _rls_fit_old_R(self, X, Y, what="the analytic classifier"):  # eq. (9) with R from before eq. (10)'s update
    X, Y = X.double(), Y.double()
    self.grow(Y.shape[1])
    W, R = self.W.clone(), self.R.clone()
    REAL["rls_fit"](self, X, Y, what)  # R updated as it should be
    self.W = W + R @ X.T @ (Y - X @ W)


def _dual_unrotated_targets(self, X, Y, what="the analytic classifier"):  # Y appended, not the batch's Q^T Y
    REAL["dual_fit"](self, X, Y, what)
    if self.recursive is None:
        n = len(X)
        self.targets[-n:] = Y.double()[:, : self.targets.shape[1]]
        self._solve(what)


def _no_label_cleansing(self, X, Y, n_old):  # the residue keeps the earlier classes' columns
    return Y - self.main(F.relu(X))


def _dsal_ratio_ignored(self, split, protocol="per-sample"):  # main + comp, the compensation ratio C taken as 1
    X = self.expand(split.features)
    return (self.main(F.relu(X)) + self.comp(torch.tanh(X))).float()


# ----------------------------------------------------------------------------------------------- SLDA / RanDumb
def _slda_constant_added(self, split, protocol="per-sample"):  # logits x W + c: the class constant's sign flipped
    return lda_mod.lda_logits(split.features, self.weight, -self.bias)


def _slda_head_from_scatter(self):  # the head solved from the scatter sum (n Sigma), not the covariance Sigma
    return lda_mod.lda_head(lda_mod.shrink(self.stats.scatter, self.cfg.shrinkage), self.stats.means, None, "SLDA", "")


def _slda_oas_about_the_overall_mean(self, x, y):  # OAS(X) of the features, not of the within-class residuals
    REAL["lda_start_oas"](self, x, y)  # the class means and counts
    x = x.to(torch.float64)
    centred = x - x.mean(0)
    n, d = centred.shape
    scatter = centred.T @ centred
    mu, alpha = float(torch.trace(scatter)) / n / d, float(scatter.pow(2).sum()) / (n * n * d * d)
    s = lda_mod.oas_coefficient(n, d, mu, alpha)
    self.scatter = scatter * (1 - s) + torch.eye(d, dtype=torch.float64) * (n * s * mu)
    return s


def _slda_oas_start_uncounted(self, x, y):  # fit_base without num_updates = N: the start weighs as one sample
    s = REAL["lda_start_oas"](self, x, y)
    self.scatter /= self.n_cov
    self.n_cov = self.n = 1
    return s


def _randumb_no_priors(self, log_priors, what, fix):  # the intercept without log(prior)
    return REAL["lda_stats_head"](self, None, what, fix)


def _randumb_unscaled_features(self, x):  # cos(x Omega + b) without its sqrt(2 / M) factor
    x = x.to(torch.float64)
    return torch.cos(x @ self.omega + self.offset) if self.cfg.embed else x


def _oas_n_not_n_plus_1(centred):  # OAS's denominator with n samples instead of n + 1
    n, d = centred.shape
    gram = centred @ centred.T
    mu, alpha = float(torch.trace(gram)) / n / d, float(gram.pow(2).sum()) / (n * n) / (d * d)
    den = n * (alpha - mu * mu / d)
    return 1.0 if den == 0 else min((alpha + mu * mu) / den, 1.0)


# ----------------------------------------------------------------------------------------------- SLCA
def _slca_norm_over_all_logits(logits, task_sizes, temperature):  # one L2 norm over every logit, not per task
    return logits / (logits.norm(p=2, dim=-1, keepdim=True) + 1e-7) / temperature


def _slca_newer_means_shrink_more(class_task, cur_task):  # the shrinking reversed: the newest classes shrink most
    return torch.tensor([0.9 + (cur_task - tc + 1) / (cur_task + 1) * 0.1 for tc in class_task], dtype=torch.float64)


MUTATIONS: dict[str, Mutation] = {
    "simplecil-normalised-mean": Mutation(
        "simplecil",
        "prototypes = mean of L2-normalised features",
        lambda: mock.patch.object(simplecil_mod, "class_means", _normalised_means),
    ),
    "simplecil-dot-product-head": Mutation(
        "simplecil",
        "logits = f . prototype instead of the cosine",
        lambda: mock.patch.object(simplecil_mod.SimpleCIL, "predict", _dot_product_predict),
    ),
    "l2p-pull-wrong-sign": Mutation(
        "l2p",
        "training loss adds the pull term instead of subtracting it",
        lambda: mock.patch.object(l2p_mod.L2P, "_forward", _pull_with_wrong_sign),
    ),
    "l2p-dot-product-keys": Mutation(
        "l2p",
        "query-key match by dot product with unnormalised keys",
        lambda: mock.patch.object(l2p_mod.PromptPool, "similarity", _dot_product_keys),
    ),
    "ease-no-synthesis": Mutation(
        "ease",
        "old-class prototypes in later subspaces are never synthesised",
        lambda: mock.patch.object(ease_mod, "synthesize_prototypes", _no_synthesis),
    ),
    "ease-no-reweight": Mutation(
        "ease",
        "inference weights every subspace 1 (alpha ignored)",
        lambda: mock.patch.object(ease_mod, "subspace_weights", _no_reweight),
    ),
    "tosca-reference-routes-per-sample": Mutation(
        "tosca",
        "the reference protocol routes each sample on its own",
        lambda: mock.patch.object(tosca_mod, "route_reference", _per_sample_as_reference),
    ),
    "tosca-per-sample-routes-by-batch": Mutation(
        "tosca",
        "the per-sample protocol routes by batch-mean entropy",
        lambda: mock.patch.object(tosca_mod.TOSCA, "routes", _batch_rule_as_per_sample),
    ),
    "tosca-l1-mean": Mutation(
        "tosca",
        "l1 term as a mean over parameters instead of a sum",
        lambda: mock.patch.object(tosca_mod.TOSCA, "_train_epochs", _l1_mean_epochs),
    ),
    "ranpac-lambda-x10": Mutation(
        "ranpac",
        "the chosen ridge lambda multiplied by 10",
        lambda: mock.patch.object(ranpac_mod, "select_ridge", _lambda_times_10),
    ),
    "ranpac-no-relu": Mutation(
        "ranpac",
        "random projection without the ReLU",
        lambda: mock.patch.object(ranpac_mod.RanPAC, "project", _no_relu),
    ),
    "aper-frozen-half-only": Mutation(
        "aper",
        "classifies on the frozen half of the concatenated features only",
        lambda: mock.patch.object(aper_mod.APER, "predict", _frozen_half_only),
    ),
    "aper-adapted-store-bypassed": Mutation(
        "aper",
        "the frozen feature stands in for the adapted half",
        lambda: mock.patch.object(aper_mod.APER, "features", _adapted_store_bypassed),
    ),
    "aper-ssf-no-shift": Mutation(
        "aper",
        "adapt=ssf: the scale-and-shift factors scale only (the shift is dropped)",
        lambda: mock.patch.object(ssf_mod.ScaleShift, "forward", _ssf_scale_only),
    ),
    "aper-vpt-one-prompt-set": Mutation(
        "aper",
        "adapt=vpt (deep): the first block's prompts are appended before every block",
        lambda: mock.patch.object(vpt_mod.VisualPrompts, "cls", _vpt_first_prompts_in_every_block),
    ),
    "aper-finetune-vit-frozen": Mutation(
        "aper",
        "adapt=finetune: the ViT copy is left frozen, only the task-0 head trains",
        lambda: mock.patch.object(first_session_mod.TunedViT, "__init__", _tuned_vit_left_frozen),
    ),
    "mos-skip-merge": Mutation(
        "mos",
        "the adapter merge after each optimizer step is skipped",
        lambda: mock.patch.object(mos_mod, "merge_toward", _skip_post_step_merge),
    ),
    "mos-refine-one-round": Mutation(
        "mos",
        "self-refinement stops after the first round",
        lambda: mock.patch.object(mos_mod, "self_refine", _refine_one_round),
    ),
    "mos-unscaled-prototype-logits": Mutation(
        "mos",
        "the ensemble's prototype logits not scaled by the number of tasks",
        lambda: mock.patch.object(mos_mod, "mos_output", _unscaled_prototype_logits),
    ),
    "dualprompt-e-prompts-at-first-e-layer": Mutation(
        "dualprompt",
        "every E-prompt block gets the first E-layer's prefix",
        lambda: mock.patch.object(dualprompt_mod.DualPrompt, "_forward", _e_prompts_at_first_e_layer),
    ),
    "dualprompt-key-value-swapped": Mutation(
        "dualprompt",
        "prefix keys and values swapped",
        lambda: mock.patch.object(prompts_mod, "prefix_attention", _key_value_swapped),
    ),
    "dualprompt-dot-product-keys": Mutation(
        "dualprompt",
        "E-key match by dot product with unnormalised keys",
        lambda: mock.patch.object(dualprompt_mod.Prompts, "similarity", _dot_product_e_keys),
    ),
    "dualprompt-keys-not-counted": Mutation(
        "dualprompt",
        "parameter counts leave out the E-prompt keys (formula and run alike)",
        lambda: mock.patch.object(dualprompt_mod.DualPrompt, "param_formula", classmethod(_keys_not_counted)),
    ),
    "fecam-no-cov-normalisation": Mutation(
        "fecam",
        "the shrunk covariance is not normalised to a correlation matrix",
        lambda: mock.patch.object(fecam_mod, "normalize_cov", _no_cov_normalisation),
    ),
    "fecam-unscaled-shrinkage": Mutation(
        "fecam",
        "shrinkage adds alpha1 I instead of alpha1 x the mean variance x I",
        lambda: mock.patch.object(fecam_mod, "shrink_cov", _unscaled_shrinkage),
    ),
    "fecam-unnormalised-features": Mutation(
        "fecam",
        "class statistics and distances on the raw features instead of the L2-normalised ones",
        lambda: mock.patch.object(fecam_mod, "embed", _unnormalised_features),
    ),
    "acil-no-relu": Mutation(
        "acil",
        "the buffer layer without its ReLU",
        lambda: mock.patch.object(acil_mod.ACIL, "expand", _acil_no_relu),
    ),
    "acil-weights-with-old-R": Mutation(
        "acil",
        "the weight update (eq. 9) uses R before its own update (eq. 10)",
        lambda: mock.patch.object(acil_mod.RecursiveRidge, "fit", _rls_fit_old_R),
    ),
    "acil-dual-unrotated-targets": Mutation(
        "acil",
        "the dual form keeps each batch's one-hot targets unrotated (Y, not V_b^T Y): W = F^T (F F^T + gamma I)^-1 Y",
        lambda: mock.patch.object(acil_mod.AnalyticRidge, "fit", _dual_unrotated_targets),
    ),
    "dsal-no-label-cleansing": Mutation(
        "dsal",
        "the compensation stream's targets keep the earlier classes' residue",
        lambda: mock.patch.object(dsal_mod.DSAL, "residue", _no_label_cleansing),
    ),
    "dsal-ratio-ignored": Mutation(
        "dsal",
        "logits = main + comp, the compensation ratio C ignored",
        lambda: mock.patch.object(dsal_mod.DSAL, "predict", _dsal_ratio_ignored),
    ),
    "slda-constant-added": Mutation(
        "slda",
        "logits x W + c instead of x W - c (the class constant's sign)",
        lambda: mock.patch.object(slda_mod.SLDA, "predict", _slda_constant_added),
    ),
    "slda-head-from-scatter": Mutation(
        "slda",
        "the head solved from the covariance's running sum, not the sum / n",
        lambda: mock.patch.object(slda_mod.SLDA, "solve", _slda_head_from_scatter),
    ),
    "slda-oas-about-the-overall-mean": Mutation(
        "slda",
        "init=oas: the OAS estimate of the features about their overall mean, not of the within-class residuals",
        lambda: mock.patch.object(lda_mod.LDAStatistics, "start_oas", _slda_oas_about_the_overall_mean),
    ),
    "slda-oas-start-uncounted": Mutation(
        "slda",
        "init=oas: the OAS start counted as one sample, not the first task's N (the later updates outweigh it)",
        lambda: mock.patch.object(lda_mod.LDAStatistics, "start_oas", _slda_oas_start_uncounted),
    ),
    "randumb-no-priors": Mutation(
        "randumb",
        "the LDA intercept without the log class priors",
        lambda: mock.patch.object(lda_mod.LDAStatistics, "head", _randumb_no_priors),
    ),
    "randumb-unscaled-features": Mutation(
        "randumb",
        "random Fourier features without the sqrt(2 / M) factor",
        lambda: mock.patch.object(randumb_mod.RanDumb, "embed", _randumb_unscaled_features),
    ),
    "randumb-oas-n": Mutation(
        "randumb",
        "OAS shrinkage with n instead of n + 1 in its denominator",
        lambda: mock.patch.object(lda_mod, "oas_shrinkage", _oas_n_not_n_plus_1),
    ),
    "slca-logit-norm-over-all": Mutation(
        "slca",
        "alignment logits divided by their norm over every class instead of the mean per-task norm",
        lambda: mock.patch.object(slow_learner_mod, "normalised_logits", _slca_norm_over_all_logits),
    ),
    "slca-shrink-reversed": Mutation(
        "slca",
        "the alignment shrinks the newest classes' means most instead of the oldest",
        lambda: mock.patch.object(slow_learner_mod, "shrink_factors", _slca_newer_means_shrink_more),
    ),
    "slca-no-covariance-ridge": Mutation(
        "slca",
        "class covariances without the reference's + 1e-4 I",
        lambda: mock.patch.object(slow_learner_mod, "COV_RIDGE", 0.0),
    ),
}

# Each method's own tests: its golden checks (tests/test_reference_golden.py, first: they are the quickest) and its
# unit-test file, by a -k selection; the tests marked slow or veryslow (real backbone, minutes) are left out.
SELECTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "simplecil": (
        ("tests/test_reference_golden.py", "tests/test_simplecil.py"),
        "simplecil or prototypes_equal or class_means",
    ),
    "l2p": (
        ("tests/test_reference_golden.py", "tests/test_l2p.py"),
        "l2p or select_prompts or batchwise or masked",
    ),
    "ease": (
        ("tests/test_reference_golden.py", "tests/test_ease.py"),
        "ease or synthesi or subspace or adapter_set",
    ),
    "tosca": (
        ("tests/test_reference_golden.py", "tests/test_tosca.py"),
        "tosca or luca or routing or module or prototype_rows or stacked",
    ),
    "ranpac": (
        ("tests/test_reference_golden.py", "tests/test_ranpac.py"),
        "ranpac or ridge or lambda or floor or projection or statistics or plain_head",
    ),
    "aper": (
        ("tests/test_reference_golden.py", "tests/test_aper.py", "tests/test_aper_variants.py"),
        "aper or adapted",
    ),
    "mos": (
        ("tests/test_reference_golden.py", "tests/test_mos.py"),
        "mos or merge or reference_forward or orth or self_refinement or per_sample_predictions",
    ),
    "dualprompt": (
        ("tests/test_reference_golden.py", "tests/test_dualprompt.py"),
        "dualprompt or prefix or prompt or untrained_keys",
    ),
    "fecam": (("tests/test_reference_golden.py", "tests/test_fecam.py"), "fecam"),
    "acil": (("tests/test_reference_golden.py", "tests/test_acil.py"), "acil or recursive"),
    "dsal": (("tests/test_reference_golden.py", "tests/test_dsal.py"), "dsal or streams or residue or compensation"),
    "slda": (("tests/test_reference_golden.py", "tests/test_slda.py"), "slda"),
    "randumb": (("tests/test_reference_golden.py", "tests/test_randumb.py"), "randumb"),
    "slca": (("tests/test_reference_golden.py", "tests/test_slca.py"), "slca"),
}


# ----------------------------------------------------------------------------------------------- CODA-Prompt
def _coda_nothing_frozen(self, frozen):  # earlier tasks' components stay trainable (the detach forgotten)
    return self.keys, self.attn, self.prompts


def _coda_attention_ignored(query, keys, attn):  # alpha = cos(q, K_m): the attention vectors A_m left out
    return F.normalize(query.float(), dim=-1) @ F.normalize(keys, dim=-1).T


def _coda_gs_new_rows_only(existing, n_new, generator):  # new components orthogonal to each other only
    return REAL_CODA_GS(existing[:0], n_new, generator)


REAL_CODA_GS = coda_mod.gram_schmidt


# ----------------------------------------------------------------------------------------------- KAC head
def _kac_basis_without_layernorm(self, x):  # the RBFs of the raw feature (KACLayer's time_benchmark path)
    return torch.exp(-(((x[..., None] - self.grid) / self.width) ** 2)).flatten(-2)


def _kac_basis_grid_major(self, x):  # the (d, G) basis flattened grid-major, not feature-major as .view does
    z = self.norm(x)[..., None]
    return torch.exp(-(((z - self.grid) / self.width) ** 2)).transpose(-1, -2).flatten(-2)


MUTATIONS["l2p-kac-basis-without-layernorm"] = Mutation(
    "l2p",
    "head=kac: the radial basis of the raw feature, its LayerNorm skipped",
    lambda: mock.patch.object(kan_mod.KACHead, "basis", _kac_basis_without_layernorm),
)
MUTATIONS["coda_prompt-kac-basis-grid-major"] = Mutation(
    "coda_prompt",
    "head=kac: the basis values ordered grid point by grid point, not feature by feature, before the spline map",
    lambda: mock.patch.object(kan_mod.KACHead, "basis", _kac_basis_grid_major),
)
MUTATIONS["coda_prompt-earlier-components-trained"] = Mutation(
    "coda_prompt",
    "earlier tasks' components are not detached in training",
    lambda: mock.patch.object(coda_mod.Components, "in_use", _coda_nothing_frozen),
)
MUTATIONS["coda_prompt-attention-vectors-ignored"] = Mutation(
    "coda_prompt",
    "component weights cos(q, K_m) without the attention vectors (q * A_m)",
    lambda: mock.patch.object(coda_mod, "component_weights", _coda_attention_ignored),
)
MUTATIONS["coda_prompt-gram-schmidt-new-rows-only"] = Mutation(
    "coda_prompt",
    "a task's new components are orthogonalised among themselves, not against the earlier ones",
    lambda: mock.patch.object(coda_mod, "gram_schmidt", _coda_gs_new_rows_only),
)
SELECTIONS["coda_prompt"] = (
    ("tests/test_reference_golden.py", "tests/test_coda_prompt.py"),
    "coda",
)


# ----------------------------------------------------------------------------------------------- InfLoRA
def _inflora_lora_on_queries(attn, x, factors):  # the branches shift the queries and values, not keys and values
    B, N, C = x.shape
    heads = int(attn.num_heads)
    q, k, v = attn.qkv(x).reshape(B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4).unbind(0)
    if factors is not None:
        ak, bk, av, bv = factors
        q = q + ((x @ ak.T) @ bk.T).reshape(B, N, heads, -1).transpose(1, 2)
        v = v + ((x @ av.T) @ bv.T).reshape(B, N, heads, -1).transpose(1, 2)
    out = F.scaled_dot_product_attention(attn.q_norm(q), attn.k_norm(k), v).transpose(1, 2).reshape(B, N, C)
    return attn.proj_drop(attn.proj(attn.norm(out) if hasattr(attn, "norm") else out))


def _inflora_unprojected(covariance, basis, project_type, rank):  # A from the raw covariance: the memory ignored
    return REAL_INFLORA_DESIGN(covariance, None, None, rank)


@contextlib.contextmanager
def _inflora_design_patched():  # the strategy module bound the name at import: patch it there too
    with (
        mock.patch.object(lora_mod, "design_down_projection", _inflora_unprojected),
        mock.patch.object(inflora_mod, "design_down_projection", _inflora_unprojected),
    ):
        yield


REAL_INFLORA_DESIGN = lora_mod.design_down_projection
MUTATIONS["inflora-lora-on-queries"] = Mutation(
    "inflora",
    "the LoRA branches shift the queries instead of the keys",
    lambda: mock.patch.object(lora_mod, "lora_attention", _inflora_lora_on_queries),
)
MUTATIONS["inflora-down-projection-ignores-memory"] = Mutation(
    "inflora",
    "A_t designed from the task's covariance without projecting off the earlier tasks' subspace",
    _inflora_design_patched,
)
MUTATIONS["inflora-down-projection-unscaled"] = Mutation(
    "inflora",
    "A_t = the singular vectors themselves, without the reference's 1 / sqrt(3)",
    lambda: mock.patch.object(lora_mod, "A_SCALE", 1.0),
)
SELECTIONS["inflora"] = (("tests/test_reference_golden.py", "tests/test_inflora.py"), "inflora or lora or memory")


# ----------------------------------------------------------------------------------------------- HiDe-Prompt
def _hide_prompt_mutations() -> None:
    import dataclasses

    import baselines.hide_prompt as hide_mod

    def no_blend(self, t, momentum):  # the training prompt is slot t itself: no momentum toward earlier slots
        return self.e[t]

    def pilot_everywhere(self, prefix, batched):  # the reference's batch-mixing layout in every forward
        return hide_mod.pilot_kv_layout(prefix)

    real_learn = hide_mod.HiDePrompt.learn_task

    def no_copy(self, task):  # slot t starts from its random init, not from slot t - 1
        self.cfg = dataclasses.replace(self.cfg, copy_prompt=False)
        return real_learn(self, task)

    MUTATIONS["hide-prompt-no-momentum-blend"] = Mutation(
        "hide_prompt",
        "the training forward and the end-of-task update use slot t unblended (prompt_momentum ignored)",
        lambda: mock.patch.object(hide_mod.EPrompts, "blended", no_blend),
    )
    MUTATIONS["hide-prompt-pilot-layout-per-sample"] = Mutation(
        "hide_prompt",
        "the per-sample protocol passes the prefixes through the reference's batch reshape",
        lambda: mock.patch.object(hide_mod.HiDePrompt, "_layout", pilot_everywhere),
    )
    MUTATIONS["hide-prompt-no-prompt-copy"] = Mutation(
        "hide_prompt",
        "slot t is not initialised from slot t - 1 (shared_prompt_pool off)",
        lambda: mock.patch.object(hide_mod.HiDePrompt, "learn_task", no_copy),
    )
    SELECTIONS["hide_prompt"] = (("tests/test_reference_golden.py", "tests/test_hide_prompt.py"), "hide_prompt or hide")


_hide_prompt_mutations()


# ----------------------------------------------------------------------------------------------- LAE
def _lae_mutations() -> None:
    import baselines.lae as lae_mod

    def online_only(self, images):  # the ensemble drops the offline module
        return F.log_softmax(self._forward(images, self.online)[:, : self.n_seen], dim=1)

    MUTATIONS["lae-offline-never-averaged"] = Mutation(
        "lae",
        "the offline module stays where it started (no moving-average step)",
        lambda: mock.patch.object(lae_mod.LAE, "ema_update", lambda self: None),
    )
    MUTATIONS["lae-ensemble-online-only"] = Mutation(
        "lae",
        "inference scores with the online module alone",
        lambda: mock.patch.object(lae_mod.LAE, "scores", online_only),
    )
    SELECTIONS["lae"] = (("tests/test_lae.py",), "lae")


_lae_mutations()


# ----------------------------------------------------------------------------------------------- TUNA
def _tuna_mean_merge(sets):  # the universal set is the plain average of the task sets (no sign election)
    merged = copy.deepcopy(sets[-1])
    with torch.no_grad():
        for name, p in merged.named_parameters():
            p.copy_(torch.stack([dict(s.named_parameters())[name] for s in sets]).mean(dim=0))
    return merged.requires_grad_(False).eval()


def _tuna_batch_entropy(logits, eps):  # one set for the whole batch: the least batch-mean entropy
    probs = F.softmax(logits, dim=-1)
    entropy = -(probs * torch.log(probs + eps)).sum(dim=-1).mean(dim=0)  # (T,)
    chosen = entropy.argmin().expand(len(logits))
    return logits[torch.arange(len(logits)), chosen], chosen


MUTATIONS["tuna-mean-merge"] = Mutation(
    "tuna",
    "the universal adapter is the mean of the task sets instead of emr_merge's elected sign and largest magnitude",
    lambda: mock.patch.object(tuna_mod, "emr_merge", _tuna_mean_merge),
)
MUTATIONS["tuna-batch-entropy"] = Mutation(
    "tuna",
    "the entropy rule picks one adapter set per test batch (least batch-mean entropy) instead of per image",
    lambda: mock.patch.object(tuna_mod, "entropy_select", _tuna_batch_entropy),
)
SELECTIONS["tuna"] = (("tests/test_tuna.py",), "tuna")

_active: list[contextlib.AbstractContextManager] = []


def pytest_configure(config) -> None:
    name = os.environ.get(ENV, "")
    if name:
        patch = MUTATIONS[name].patch()
        patch.__enter__()  # raises AttributeError if the patched name no longer exists: the run errors, not passes
        _active.append(patch)


def pytest_unconfigure(config) -> None:
    while _active:
        _active.pop().__exit__(None, None, None)


# ----------------------------------------------------------------------------------------------- CoFiMA
REAL_COFIMA_FISHER = cofima_mod.fisher_diagonal
REAL_COFIMA_MERGE = cofima_mod.merge_weights


def _cofima_fisher_uncapped(params, batches, logits_of, cap):  # the cap at fishermax left out
    return REAL_COFIMA_FISHER(params, batches, logits_of, float("inf"))


def _cofima_merge_weights_swapped(theta0, theta1, alpha, fisher0=None, fisher1=None, new_head="copy"):  # 1 - a, a
    return REAL_COFIMA_MERGE(theta0, theta1, 1 - alpha, fisher0, fisher1, new_head)


MUTATIONS["cofima-fisher-uncapped"] = Mutation(
    "cofima",
    "the Fisher diagonal without the reference's cap at 1e-4 (fishermax)",
    lambda: mock.patch.object(cofima_mod, "fisher_diagonal", _cofima_fisher_uncapped),
)
MUTATIONS["cofima-merge-weights-swapped"] = Mutation(
    "cofima",
    "the merge gives the previous model the weight wt_lambda and the new one 1 - wt_lambda",
    lambda: mock.patch.object(cofima_mod, "merge_weights", _cofima_merge_weights_swapped),
)
SELECTIONS["cofima"] = (("tests/test_cofima.py",), "cofima or fisher or merge")


# ----------------------------------------------------------------------------------------------- SD-LoRA
def _sd_lora_mutations() -> None:
    import baselines.sd_lora as sd_mod

    def unnormalised(self, block):  # old directions enter as alpha_i B_i A_i, not divided by ||B_i|| ||A_i||
        if not self.n_tasks:
            return None
        out = []
        for a_list, b_list in ((self.a_q, self.b_q), (self.a_v, self.b_v)):
            out.append(torch.cat([a_list[t][block] for t in range(self.n_tasks)]))
            out.append(torch.cat([b_list[t][block] * self.alpha[t] for t in range(self.n_tasks)], dim=1))
        return tuple(out)

    def current_magnitude_only(cfg, lora, head, lr):  # old tasks' magnitudes left out of the optimiser
        params = [*lora.current(), lora.alpha[-1], head.weight, head.bias]
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    real_attention = sd_mod.qv_lora_attention

    def keys_not_values(attn, x, factors):  # the second pair shifts the keys (InfLoRA's layout), not the values
        if factors is None:
            return real_attention(attn, x, None)
        aq, bq, av, bv = factors
        d = x.shape[-1]
        shifted = copy.deepcopy(attn)
        with torch.no_grad():
            shifted.qkv.weight[:d] += (bq @ aq).detach()
            shifted.qkv.weight[d : 2 * d] += (bv @ av).detach()
        return real_attention(shifted, x, None)

    MUTATIONS["sd-lora-unnormalised-old-directions"] = Mutation(
        "sd_lora",
        "old tasks' directions are not normalised by ||B|| ||A|| before their magnitude scales them",
        lambda: mock.patch.object(sd_mod.QVLoRA, "factors", unnormalised),
    )
    MUTATIONS["sd-lora-old-magnitudes-frozen"] = Mutation(
        "sd_lora",
        "only the current task's magnitude trains; the old tasks' stay at their start",
        lambda: mock.patch.object(sd_mod, "task_optimizer", current_magnitude_only),
    )
    MUTATIONS["sd-lora-keys-not-values"] = Mutation(
        "sd_lora",
        "the second LoRA pair shifts the attention keys instead of the values",
        lambda: mock.patch.object(sd_mod, "qv_lora_attention", keys_not_values),
    )
    SELECTIONS["sd_lora"] = (("tests/test_sd_lora.py",), "sd_lora")


_sd_lora_mutations()


# ----------------------------------------------------------------------------------------------- CL-LoRA
def _cl_lora_unit_sum_reassignment(teacher_up):  # row norms over their sum, without the factor d: mean 1/d, not 1
    norms = teacher_up.norm(dim=1)
    return (norms / norms.sum()).unsqueeze(1)


MUTATIONS["cl_lora-reassignment-without-width"] = Mutation(
    "cl_lora",
    "the gradient reassignment's row factors sum to 1 instead of d (the distillation step shrinks d-fold)",
    lambda: mock.patch.object(cl_lora_mod, "reassignment_weights", _cl_lora_unit_sum_reassignment),
)
SELECTIONS["cl_lora"] = (("tests/test_cl_lora.py",), "cl_lora or golden or reassignment")


# ----------------------------------------------------------------------------------------------- DUCT
def _duct_mutations() -> None:
    def ratio_swapped(old_w, cur_w, plan, ratio):  # the old block keeps `ratio`, the transported one 1 - ratio
        moved = (plan.T @ cur_w.double()).to(old_w.dtype)
        return ratio * old_w + (1 - ratio) * moved

    real_copy = duct_mod.DUCT._copy_of_pretrained

    def from_merged(self):  # each task fine-tunes a copy of the merged ViT, not of the pre-trained one
        model = real_copy(self)
        merged = getattr(self, "model", None)
        if merged is not None:
            model.load_state_dict(merged.state_dict())
        return model

    MUTATIONS["duct-transport-ratio-swapped"] = Mutation(
        "duct",
        "the transport keeps head_merge_ratio of the old block and 1 - head_merge_ratio of the transported one",
        lambda: mock.patch.object(duct_mod, "transported_block", ratio_swapped),
    )
    MUTATIONS["duct-fine-tunes-the-merged-vit"] = Mutation(
        "duct",
        "each task fine-tunes from the merged ViT instead of the pre-trained one (continual fine-tuning)",
        lambda: mock.patch.object(duct_mod.DUCT, "_copy_of_pretrained", from_merged),
    )
    SELECTIONS["duct"] = (("tests/test_duct.py",), "duct")


_duct_mutations()


def _cl_lora_kd_student_unscaled(pred, soft, temperature):  # the temperature divides the teacher's logits only
    log_p = torch.log_softmax(pred, dim=1)
    return -(torch.softmax(soft / temperature, dim=1) * log_p).sum() / pred.shape[0]


MUTATIONS["cl_lora-kd-student-unscaled"] = Mutation(
    "cl_lora",
    "the distillation loss softens the teacher's logits by the temperature but not the student's",
    lambda: mock.patch.object(cl_lora_mod, "kd_loss", _cl_lora_kd_student_unscaled),
)
