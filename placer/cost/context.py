"""The pricing context: one problem's job, its efficiency factors and the memo of its prices.

Pricing one job walks the same replica layouts again and again (a cost table of thousands of
candidates; the simulator's replicas; a split role's parts at many sample counts). What is worth
keeping between those calls hangs off one `StepTerms` per (model, device, replica layout,
efficiency): its step and prefill lines and its engine replays (`placer.cost.batching`). The
context owns that table, so every memo lives exactly as long as the problem and nothing in the
library keeps state from one problem to the next.

The cost modules take a `PriceContext` where they used to take the pair (res, calib);
`placer.cost.pricer.Pricer` adds the entry points the solver, the baselines and the simulator
call. They are two classes so that the modules between them can take the context without
importing their own callers.

The job's framework profile (`placer.spec.framework`) sets some factors of its own (its
dispatch, its weight-sync bucket and sender): `calib` is the given calibration with those
replaced (`framework_calibration`), and so does the job's `engine` section (the run's own
engine memory share and sequence limit, which win over the profile's): `calib` is the one
every price reads; `given` is the calibration as given, the one a plan records.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Self

from placer.base.errors import SpecError
from placer.cost.batching import StepTerms, step_terms
from placer.cost.efficiency import Calibration, Efficiency
from placer.cost.sharding import Parallel
from placer.spec.arch import ModelArch
from placer.spec.catalog import Resolved
from placer.spec.hardware import DeviceType, Pool

TermsKey = tuple[ModelArch, DeviceType, Parallel, Efficiency]


class PriceContext:
    """A resolved job and its calibration, with the problem's `StepTerms` table."""

    prices_agents = False  # a multi-agent job: `placer.cost.agents.AgentPricer` only

    def __init__(self, res: Resolved, calib: Calibration | None = None,
                 _terms: dict[TermsKey, StepTerms] | None = None, step_draws: int = 0) -> None:
        if res.job.agents is not None and not self.prices_agents:  # never as one agent alone
            raise SpecError(f"{res.job.name}: agents: a multi-agent job is priced per agent "
                            "(placer.cost.agents.AgentPricer); this command does not run such "
                            "jobs yet")
        self.res = res
        # a split role's part (`with_samples`): the samples the whole step generates, which its
        # batch's longest sample is drawn from (0: the job's own batch)
        self.step_draws = step_draws
        self.given = calib if calib is not None else Calibration()
        engine = res.job.engine.factors() if res.job.engine is not None else {}
        self.calib = framework_calibration(self.given, {**res.job.profile.factors, **engine})
        self._terms: dict[TermsKey, StepTerms] = {} if _terms is None else _terms
        # The same objects come back for every candidate: look them up by identity first (the
        # entry holds them, so their ids stay theirs), by value (a hash of every field) else.
        self._seen: dict[tuple[int, int, Parallel, int], tuple[TermsKey, StepTerms]] = {}

    def eff(self, dev: DeviceType | Pool | str) -> Efficiency:
        """The efficiency factors of a device type (or of a pool's device type)."""
        return self.calib.for_device(dev if isinstance(dev, DeviceType) else self.res.device_of(dev))

    def step_terms(self, m: ModelArch, dev: DeviceType, par: Parallel, eff: Efficiency
                   ) -> StepTerms:
        """The replica's `StepTerms`, one per replica layout (candidates differ in dp; one
        replica's steps do not), keyed by value."""
        rep = replace(par, dp=1)  # the whole replica layout (EP, FP8, CUDA graphs), one replica
        fast = (id(m), id(dev), rep, id(eff))
        hit = self._seen.get(fast)
        if hit is not None and hit[0][0] is m and hit[0][1] is dev and hit[0][3] is eff:
            return hit[1]
        key = (m, dev, rep, eff)
        st = self._terms.get(key)
        if st is None:
            st = self._terms[key] = step_terms(m, dev, rep, eff)
        self._seen[fast] = (key, st)
        return st

    def with_samples(self, n: int) -> Self:
        """This problem's context on the job with a batch of `n` samples (a split role's part):
        the same factors and the same `StepTerms` table (a replica's steps do not depend on the
        batch; replays are kept by their sample counts). The step still draws the whole job's
        samples: the part's tail is priced with the longest of those (`step_draws`), so a part
        is priced as the same engines within one pool would be (`placer.cost.split`)."""
        draws = self.step_draws or self.res.job.tail_policy.mechanism.generated(
            self.res.job.batch.samples)
        return type(self)(self.res.with_samples(n), self.given, self._terms, draws)

    def with_own_samples(self, n: int) -> Self:
        """This problem's context on the job with a batch of `n` samples whose tail is their
        own (a separate generation of `n` sequences, `placer.cost.validation`), not drawn from
        the step's samples as a split role's part is (`with_samples`), every one waited for
        (no tail policy: a validation generates its whole set)."""
        res = self.res.with_samples(n)
        job = res.job.model_copy(update={"tail_policy": type(res.job.tail_policy)()})
        return type(self)(replace(res, job=job), self.given, self._terms, 0)

    def with_res(self, res: Resolved) -> Self:
        """The context of another resolved job that shares this one's models and devices (the
        same table: it is keyed by value)."""
        return type(self)(res, self.given, self._terms, self.step_draws)


def framework_calibration(calib: Calibration, factors: Mapping[str, float]) -> Calibration:
    """`calib` with a framework profile's own factors in place of its values (itself, the same
    object, when the profile sets none: native plans price exactly as before)."""
    if not factors:
        return calib
    return replace(calib, default=calib.default.override(dict(factors)),
                   per_device={k: e.override(dict(factors)) for k, e in calib.per_device.items()})
