"""The run record's schema versions: the current one, the history of what each changed, and the pure-JSON upgrades
that readers apply on load (:data:`UPGRADES`; :mod:`clbench.records.upgrade` rewrites the older ones once)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clbench.records.command import as_typed

Json = dict[str, Any]

SCHEMA_VERSION = 6  # see the version history below

# Version history. A record of version OLDEST_READABLE or later is upgraded on load (:data:`UPGRADES`: pure JSON). One
# of versions 1 to 3 is refused with a message naming ``clbench records upgrade`` (:mod:`clbench.records.upgrade`),
# which rewrites it once: restating its parameter counts needs the method's code, and reading records imports none. One
# older than OLDEST_UPGRADABLE, or newer than SCHEMA_VERSION, is refused.
#   1: fields were added without a version change (fingerprint, n_images, class_names, resumed_from_task,
#      time_s.checkpoint, host details, precision_reason); records before ``--precision`` say ``autocast: true/false``
#      (bf16 / fp32) instead of ``precision``.
#   2: written through :class:`RunRecord`: ``precision`` always named; every top-level field present (null where
#      unknown) but ``protocol_gap``, ``finished``, ``training_warning`` and ``tracker_events``, written where set
#      (the last two added later; a record without them means none). The JSON layout is version 1's.
#   3: ``predictions`` names the run's per-image predictions file (clbench.records.predictions) with its sha256 and
#      size, or is null where the run kept none; every protocol's metrics add ``bwt``, ``ece``, ``last_acc_ci`` and
#      ``avg_acc_ci``, written where known (the last three need predictions). Version-2 records lack them all.
#   4: one parameter accounting for every method (:class:`clbench.methods.contract.ParamCounts`): ``params.added_*``
#      counts learned parameters only (heads included: TOSCA's head rows are in it now), ``params.stored_*`` the
#      statistics kept (prototypes, means, covariances, Gram matrices, random projections), which versions 2 and 3
#      counted as added for SimpleCIL, EASE, APER, RanPAC (its W) and MOS. :func:`clbench.records.upgrade.upgrade_v3`
#      restates an older record through the rule on the strategy's card (``split_kept``, the split its live runs use).
#   5: ``train_per_class`` is a run setting (``--train-per-class``), written at the top level where set; version 4
#      held it in ``strategy_config`` of the six methods that had it. :func:`_upgrade_v4` moves it out. Added later
#      without a version change, written where known: ``data_fingerprint`` (train/test content digests; a record
#      without it is of unknown data, which matches any) and ``resume_warning`` (a resume that added no task).
#   6: standard JSON: an undefined number is written null, not ``NaN`` (which jq, JavaScript's ``JSON.parse`` and most
#      non-Python readers refuse); ``old_acc`` after the first task is the one such value, read back as NaN. The
#      ``command`` as the user typed it: ``clbench ...``, paths relative to the working directory, ``<abs>/NAME``
#      outside it; :func:`_upgrade_v5` restates an older record's command so.
OLDEST_UPGRADABLE = 1  # the oldest version `clbench records upgrade` rewrites
OLDEST_READABLE = 4  # the oldest version readers read (and upgrade on load)
UPGRADE_COMMAND = "clbench records upgrade"


def _upgrade_v4(data: Json) -> Json:
    """A version-4 (or older) record as version 5: ``train_per_class`` moved from ``strategy_config`` to the top
    level (a run setting now); absent or null there stays unset."""
    config = dict(data.get("strategy_config") or {})
    k = config.pop("train_per_class", None)
    return {**data, "strategy_config": config, **({"train_per_class": k} if k is not None else {})}


def _upgrade_v5(data: Json) -> Json:
    """A version-5 (or older) record as version 6: its command as typed (:func:`as_typed`: ``clbench`` for the
    interpreter and entry point, ``<abs>/NAME`` for each absolute path of the machine it was made on); the numbers
    untouched (the file's ``NaN`` reads as the NaN a version-6 file spells null)."""
    command = data.get("command")
    return {**data, "command": as_typed(command.split(" "), None)} if isinstance(command, str) and command else data


UPGRADES: dict[int, Callable[[Json], Json]] = {
    4: _upgrade_v4,
    5: _upgrade_v5,
}  # version -> the next version, from OLDEST_READABLE: pure JSON (clbench.records.upgrade adds 1 to 3: they need
# the methods)
