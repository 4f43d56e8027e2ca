"""The `actor` role: policy training as the plan lays it out (`executors.sharding`).

One `Trainer` per device of the role's layout (`dp * cp * tp * pp` ranks, rank `((p * dp + d) *
cp + c) * tp + t`), all in one torch.distributed group (gloo on CPU, NCCL on GPU) that
`init_group` forms; the model is then re-loaded from the run's version-0 folder, cut to the
rank's pipeline stage when `pp > 1` (`executors.pipeline`), and sharded: TP over the mesh's "tp"
dim, FSDP2 over "dp" (over "dp" x "cp" with context parallelism, whose ranks each run a slice
of every sequence and sum their losses and statistics over "cp": `executors.cpattn`). A
world of one trains the plain model. When the plan's layout says `recompute`, every decoder layer
(of the whole model, or of the rank's stage) recomputes its activations in the backward pass
(`executors.sharding.recompute_layers`, inside FSDP2), whatever the world. The plan's BF16
computes under autocast over FP32 master weights, FSDP2 gathering BF16 parameters
(`executors.precision`); a `RunConfig` built by hand trains in FP32.

Each RL step (`train`) runs the step's mini-batches, one optimizer step each (the job's
`batch.mini_batches`); the driver (`executors.training`) has already cut every mini-batch into
this rank's part, itself cut into `accumulate` micro-batches whose gradients add up before the
step (gradient accumulation). Every rank runs the same number of micro-batches, so that FSDP's
and TP's collectives pair up; a rank with no samples in a micro-batch runs one sample at weight
zero. Before the first optimizer step the trainer computes the proximal ("old") log-probs of its
samples (`executors.rl`, OFF_POLICY). Every log-prob (old and new) is of softmax(logits / T), T
the job's `sampling.temperature` that the rollout sampled at; the job's KL enters the loss only
when it is not in the reward (`rl.KLTerm`). A step reports the token means of `STATS` and the
gradient norm of each optimizer step. With pipeline stages, a mini-batch's micro-batches are one
schedule step and the loss, its statistics and the old log-probs live on the last stage.

What a weight refresh streams (the step's weights kept whole on the host where the plan's host
memory holds them, else gathered from the shards as the buckets need them), and `weights()`,
come from `executors.trainersync.TrainerSender`, which the trainer mixes in. A sharded trainer
writes its checkpoint rank by rank, each rank its own shards (`executors.shardckpt`, as torch's
DCP: nothing gathered onto one host), with TP's 2-D shards and with pipeline stages too; one
process writes one file in the one-process format (full weights, full Adam state by parameter
index). Either is read back in that format, whatever the layout that wrote it, so a run
re-planned onto another layout (a lost node) restores it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from executors import collprobe, rl, shardckpt
from executors.cpattn import cp_logprobs, cp_sum, enable_cp, own_only
from executors.experts import sync_expert_grads
from executors.layoutread import mismatch, read_layout
from executors.pipeline import Pipeline, PolicyLoss, Stage, pack
from executors.precision import autocast, wire_nbytes
from executors.procgroup import GroupMember
from executors.roles import RunConfig, Worker, _timing, save_checkpoint
from executors.runplan import Layout
from executors.sharding import build_mesh, clip_grad_norm, recompute_layers, shard
from executors.trainersync import TrainerSender
from executors.vlm import encoder_spans, load_model

# One micro-batch of one rank: (samples, advantages, reference log-probs or None, loss scale).
# The scale is 1 / (the mini-batch's generated tokens), or 0 for a stand-in sample.
Micro = tuple[rl.Samples, list[list[float]], list[list[float]] | None, float]
MiniBatch = list[Micro]
# the per-token statistics of `rl.policy_loss` a step reports (token means over the step)
STATS = ("kl", "clip_frac", "tis_truncated", "entropy")


class Trainer(Worker, TrainerSender, GroupMember):
    """One rank of policy training."""

    def __init__(self, cfg: RunConfig, rank: int = 0, world: int = 1) -> None:
        super().__init__(cfg, "actor", rank)
        self.world = world
        # a world of one trains the whole batch on one rank, recomputing as the plan says
        self.layout = cfg.trainer if world > 1 else Layout(recompute=cfg.trainer.recompute)
        if self.layout.world != world:
            raise ValueError(f"trainer: layout {self.layout} needs {self.layout.world} ranks, "
                             f"the run made {world}")
        self.version = 0
        self.optimizer_steps = 0
        self.pipe = None  # the mixin's attributes (`TrainerSender`)
        self._stream = None
        self._kept = None
        self._build(sharded=False)

    def _build(self, sharded: bool) -> None:
        """The model (version 0) and its optimizer; sharded over the mesh once a group exists."""
        self.model = load_model(self.cfg.model_dir)
        self.model.train()
        # the bytes a refresh carries (BF16 for a BF16 job: `executors.precision.wire_dtype`)
        self._nbytes = wire_nbytes(self.model.state_dict(), self._sync_dtype())
        if torch.cuda.is_available():  # Ray gives each rank its own GPU (CUDA_VISIBLE_DEVICES)
            self.model.cuda()
        self.pipe = None
        self._pp_mesh: Any = None  # the mesh dim the pipeline's stages were cut over
        self._cp_group: Any = None  # the group this rank's sequences are split over (cp > 1)
        if sharded:
            mesh = build_mesh(self.layout)
            if self.layout.cp > 1:  # attention gathers K and V over "cp" (`executors.cpattn`)
                enable_cp(self.model, mesh["cp"])
                self._cp_group = mesh["cp"].get_group()
            if self.layout.pp > 1:  # keep this rank's stage only
                self._stage_of(mesh)
            shard(self.model, mesh, recompute=self.layout.recompute,
                  precision=self.cfg.precision, ep=self.layout.ep)
            if self.pipe is not None and self.layout.tp > 1:
                self.pipe.split_vocab(mesh["tp"])
        elif self.layout.recompute:
            recompute_layers(self.model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=self.cfg.lr)
        self.version = 0
        self._kept = None

    def _stage_of(self, mesh: Any) -> None:
        """Replace the whole model by this rank's pipeline stage; its parameters' indices in
        the whole model's parameter order (the one-process optimizer's, for checkpoints)."""
        order = {n: i for i, (n, _) in enumerate(self.model.named_parameters())}
        self._params = len(order)
        p = self.layout.stage(self.rank)
        stage = Stage(self.model, p, self.layout.pp)
        self._index = [order[stage.full_name(n)] for n, _ in stage.named_parameters()]
        # the whole model's tensors, stage after stage, and the stage that holds each (the
        # first, for a buffer every stage holds): what rank 0 streams unbucketed
        self._owner = {}
        self._whole_meta = {}
        for q in range(self.layout.pp):
            st = stage if q == p else Stage(self.model, q, self.layout.pp)
            for k, v in st.state_dict().items():
                if st.full_name(k) not in self._owner:
                    self._owner[st.full_name(k)] = q
                    self._whole_meta[st.full_name(k)] = torch.empty(
                        tuple(v.shape), dtype=v.dtype, device="meta")
        dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        self.model = stage
        self._pp_mesh = mesh["pp"]
        self.pipe = Pipeline(stage, p, self.layout.pp, mesh["pp"].get_group(), dev,
                             self.cfg.precision)

    def executed_layout(self, ranks: int) -> dict[str, Any]:
        """The layout this rank trains with, read off the model it built (`ranks`: the role's
        processes; `executors.layoutread`): mesh, placements, experts held, its stage's
        layers. A build that differs from the plan's layout is an error, not a report."""
        if ranks != self.layout.world:
            raise RuntimeError(f"trainer: {ranks} ranks for layout {self.layout}")
        read = read_layout(self.model, self._pp_mesh)
        why = mismatch(read, self.layout)
        if why:
            raise RuntimeError(f"trainer rank {self.rank}: the built model runs {why}")
        return {**read, "precision": self.cfg.precision, "stage": self.layout.stage(self.rank),
                "micro_batches": self.cfg.accumulate}

    def init_group(self, addr: str, port: int) -> bool:
        """Join the trainers' group (`executors.procgroup`), then rebuild the model sharded
        over the layout's mesh."""
        if self.world == 1:
            return True
        self.join_group(addr, port)
        self._build(sharded=True)
        return True

    def train(self, minis: list[MiniBatch]) -> tuple[dict, dict]:
        """The RL step: proximal log-probs, then one optimizer step per mini-batch."""
        if self.pipe is not None:
            return self._train_stages(minis)
        t0 = time.time()
        old = [[self._logprobs(m[0]) for m in mb] for mb in minis]
        losses: list[float] = []
        norms: list[float] = []  # global gradient norm of each mini-batch, before clipping
        stats = dict.fromkeys(STATS, 0.0)
        for mb, olds in zip(minis, old):
            self.opt.zero_grad()
            loss_sum = 0.0
            for (s, adv, ref, scale), o in zip(mb, olds):
                loss, info = self._micro_loss(s, adv, ref, o)
                (loss * scale).backward()
                loss_sum += info.pop("loss") * scale
                for k in stats:  # token sums: scaled, they are this rank's mini-batch means
                    stats[k] += info[k] * scale / len(minis)
            sync_expert_grads(self.model)  # under EP x TP each TP rank ran a slice of tokens
            params = list(self.model.parameters())
            norms.append(clip_grad_norm(params, 1.0) if self.world > 1
                         else float(torch.nn.utils.clip_grad_norm_(params, 1.0)))
            self.opt.step()
            self.optimizer_steps += 1
            losses.append(loss_sum)
        return self._stepped(t0, minis, losses, norms, stats)

    def _train_stages(self, minis: list[MiniBatch]) -> tuple[dict, dict]:
        """`train` with pipeline stages: each mini-batch one schedule step over its
        micro-batches (`executors.pipeline`). Loss and statistics are the last stage's; the
        other stages report 0 for them (`Layout.leads` picks the last stage's results)."""
        assert self.pipe is not None
        t0 = time.time()
        packed = [pack(mb) for mb in minis]
        # before the first optimizer step
        old = [self.pipe.logprobs(pk, self.cfg.temperature) for pk in packed]
        first = minis[0][0]
        loss_fn = PolicyLoss(self.cfg.kl, self.cfg.temperature, first[2] is not None,
                             bool(first[0].logprobs))
        losses: list[float] = []
        norms: list[float] = []
        stats = dict.fromkeys(STATS, 0.0)
        for pk, o in zip(packed, old):
            self.opt.zero_grad()
            calls = self.pipe.train(pk, o, loss_fn)
            for _, info, scale in calls:
                for k in stats:
                    stats[k] += info[k] * scale / len(minis)
            losses.append(sum(v * scale for v, _, scale in calls))
            sync_expert_grads(self.model)
            norms.append(clip_grad_norm(list(self.model.parameters()), 1.0, self.pipe.group))
            self.opt.step()
            self.optimizer_steps += 1
        return self._stepped(t0, minis, losses, norms, stats)

    def _stepped(self, t0: float, minis: list[MiniBatch], losses: list[float],
                 norms: list[float], stats: dict[str, float]) -> tuple[dict, dict]:
        """After the step's optimizer steps: the new version (its weights kept whole for the
        next refresh where the plan keeps them, `_keep`) and the result."""
        self.version += 1
        self._keep()
        seen = [m[0] for mb in minis for m in mb if m[3] > 0]
        ids = list(dict.fromkeys(i for s in seen for i in s.ids))
        return ({"loss": sum(losses) / max(len(losses), 1), "version": self.version,
                 "optimizer_steps": len(minis), "grad_norms": norms, **stats},
                _timing(t0, tokens=sum(s.tokens() for s in seen), sample_ids=ids,
                        **encoder_spans(self.model)))

    @torch.no_grad()
    def _logprobs(self, s: rl.Samples) -> torch.Tensor:
        with autocast(self.cfg.precision):
            if self._cp_group is None:
                return rl.response_logprobs(self.model, s, self.cfg.temperature)
            part = self._cp_logprobs(s, entropy=False)[0]
        return cp_sum(part, self._cp_group)  # every CP rank holds the whole batch's

    def _cp_logprobs(self, s: rl.Samples, entropy: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """This CP rank's share of the log-probs (`executors.cpattn.cp_logprobs`)."""
        lay = self.layout
        return cp_logprobs(self.model, s, self.cfg.temperature, lay.cp,
                           lay.cp_index(self.rank), self._cp_group, entropy)

    def _micro_loss(self, s: rl.Samples, adv: list[list[float]], ref: list[list[float]] | None,
                    old: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The micro-batch's summed token loss (the caller scales it by 1 / mini-batch tokens)
        and its statistics, with the loss's value as "loss". Under CP the loss is this rank's
        positions' (its gradient), the value and statistics the CP group's sums."""
        _, _, rmask = rl.pack(s)
        with autocast(self.cfg.precision):  # the backward follows the forward's dtypes
            if self._cp_group is None:
                logp, ent = rl.response_logprobs_entropy(self.model, s, self.cfg.temperature)
            else:
                logp, ent, rmask = self._cp_logprobs(s)
        w = rmask.shape[1]
        a = rl.to_padded(adv, w)
        r = rl.to_padded(ref, w) if ref is not None else None
        behaviour = rl.to_padded(s.logprobs, w) if s.logprobs else None
        if self._cp_group is not None:  # other ranks' positions: ratio 1, KL 0 (masked out)
            old = own_only(old, rmask, logp)
            r = own_only(r, rmask, logp) if r is not None else None
            behaviour = own_only(behaviour, rmask, logp) if behaviour is not None else None
        kl = self.cfg.kl  # in the loss, or counted in the reward (`executors.training`)
        loss, info = rl.policy_loss(logp, old, a, rmask, r, kl.loss_coef, denom=1.0,
                                    behaviour=behaviour, kl_estimator=kl.estimator, entropy=ent)
        info["loss"] = float(loss.detach())
        if self._cp_group is not None:  # the CP group's sums: every rank reports its DP group's
            keys = sorted(info)
            total = cp_sum(torch.tensor([info[k] for k in keys], dtype=torch.float64),
                           self._cp_group)
            info = dict(zip(keys, total.tolist()))
        return loss, info

    def probe_collectives(self) -> list[dict[str, Any]]:
        """Time the group's collectives (`executors.collprobe`); every rank calls it."""
        return collprobe.probe(self.world) if self.world > 1 else []

    def save(self, path: str, step: int, shards: bool = True) -> str:
        """A checkpoint at `path` that any layout restores (a re-plan may change the layout).
        Sharded, a folder of each rank's own shards (`executors.shardckpt`: nothing gathered
        onto one host, whatever the dp, tp and pp; each pipeline stage's tensors by the whole
        model's names and parameter indices); one process, one file in the one-process format
        (full weights, full Adam state by parameter index). Every rank of a sharded trainer
        calls it (a collective). `shards` False: one file whatever the layout (a run's final
        weights, which tools read as one file), gathered onto rank 0."""
        if shards and self.world > 1:
            sd = self.opt.state_dict()
            groups, head = sd["param_groups"], 0
            name: Callable[[str], str] = str
            index: Callable[[int], int] = int
            if self.pipe is not None:  # the stage's names and indices in the whole model's
                name, index = self.pipe.stage.full_name, self._index.__getitem__
                groups = [{**g, "params": list(range(self._params))} for g in groups]
                head = self.layout.rank_of(self.layout.stage(self.rank), 0, 0, 0)
            state: dict[tuple[Any, ...], Any] = {
                ("model", name(k)): v for k, v in self.model.state_dict().items()}
            state.update({("optim", index(int(i)), k): v for i in sorted(sd["state"])
                          for k, v in sorted(sd["state"][i].items())})
            return shardckpt.save(path, self.rank, self.world, state, {
                "version": self.version, "step": step, "optimizer_steps": self.optimizer_steps,
                "param_groups": groups}, head=head)
        if self.world == 1:
            model, optim = self.model.state_dict(), self.opt.state_dict()
        else:
            optim = shardckpt.full_optim(self.opt)
            model = self.weights()
            if self.pipe is not None:
                optim = self._stages_optim(optim)
        if self.rank == 0:
            save_checkpoint(path, {"model": model, "optim": optim, "version": self.version,
                                   "step": step, "optimizer_steps": self.optimizer_steps})
        return path

    def _stages_optim(self, local: dict[str, Any]) -> dict[str, Any]:
        """Every stage's optimizer state by the whole model's parameter index, on rank 0."""
        parts = self._from_stages({self._index[int(i)]: st for i, st in local["state"].items()})
        state = {i: st for part in parts or [] for i, st in part.items()}
        return {"state": dict(sorted(state.items())),
                "param_groups": [{**g, "params": list(range(self._params))}
                                 for g in local["param_groups"]]}

    def load(self, path: str) -> int:
        """Every rank reads the checkpoint and keeps its own shards of it (a kept copy of the
        weights is dropped: the next refresh gathers)."""
        self._kept = None
        ck = shardckpt.load(path)
        if self.world == 1:
            self.model.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["optim"])
        else:
            model, optim = ck["model"], ck["optim"]
            if self.pipe is not None:  # this stage's part, by the whole model's names
                stage = self.pipe.stage
                model = {k: model[stage.full_name(k)] for k in stage.state_dict()}
                optim = {"state": {i: optim["state"][g] for i, g in enumerate(self._index)
                                   if g in optim["state"]},
                         "param_groups": optim["param_groups"]}
            shardckpt.load_full(self.model, model)
            shardckpt.load_sharded_optim(self.opt, optim)
        self.version = ck["version"]
        self.optimizer_steps = ck.get("optimizer_steps", 0)
        return self.version
